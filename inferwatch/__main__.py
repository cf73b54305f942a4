from inferwatch.cli import app

app(prog_name="inferwatch")
