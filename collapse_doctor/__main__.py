from collapse_doctor.cli import run

run()
