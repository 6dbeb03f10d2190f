from sc_app.cli import script

script()
