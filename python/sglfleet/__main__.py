from sglfleet.cli import run

run()
