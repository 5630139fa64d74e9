"""The ``pgjax`` command (pgjax/__main__.py): each subcommand is its module's command line, the console
script is declared, and a mistake in the subcommand is one line with the usage."""
import pathlib
import subprocess
import sys
import tomllib

import pytest

from pgjax import __main__ as pgjax_command
from pgjax import demo

ROOT = pathlib.Path(__file__).parent.parent


def test_the_console_script_is_the_subcommand_dispatcher():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"pgjax": "pgjax.__main__:main"}


def test_every_subcommand_names_a_module_with_a_command_line():
    import importlib
    for name, (module, text) in pgjax_command.SUBCOMMANDS.items():
        assert callable(importlib.import_module(module).main), name
        assert text and name in pgjax_command.usage()


def test_a_subcommand_prints_what_its_module_prints(capsys):
    assert demo.main(["--table"]) is None
    alone = capsys.readouterr().out
    assert pgjax_command.main(["demo", "--table"]) == 0
    assert capsys.readouterr().out == alone and "| `dr_grpo` |" in alone


def test_a_subcommand_gives_its_modules_help_and_exit_status(capsys):
    with pytest.raises(SystemExit) as stop:
        pgjax_command.main(["plan", "--help"])
    assert stop.value.code == 0 and "--model MODEL" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        pgjax_command.main(["plan"])                                # no --model: argparse's own error
    assert stop.value.code == 2 and "--model" in capsys.readouterr().err


def test_no_or_an_unknown_subcommand_prints_the_usage(capsys):
    assert pgjax_command.main([]) == 2
    assert "pgjax SUBCOMMAND" in capsys.readouterr().out
    assert pgjax_command.main(["--help"]) == 0
    assert pgjax_command.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pgjax: no subcommand 'trian'") and "  run " in err


@pytest.mark.slow
def test_python_dash_m_pgjax_runs_a_subcommand():
    done = subprocess.run([sys.executable, "-m", "pgjax", "audit", "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
