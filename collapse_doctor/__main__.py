from collapse_doctor.cli import main

main()
