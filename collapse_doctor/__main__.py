from collapse_doctor.cli.app import run

run()
