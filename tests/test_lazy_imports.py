"""`import opforge` brings in the tensor ops only: the front-ends and their dependencies load on
first use (issue 23: a user of the ops pays nothing for SQL, streams or the placement driver)."""
import subprocess
import sys

FRONT_END_DEPENDENCIES = ("sqlglot", "pyarrow", "pandas", "fastapi", "uvicorn", "matplotlib", "rich")
FRONT_ENDS = ("opforge.sql", "opforge.stream", "opforge.placement", "opforge.distributed")


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_opforge_loads_no_front_end():
    out = _run(
        "import sys, opforge\n"
        "x = opforge.add(__import__('torch').ones(3), 1.0)\n"
        f"print(sorted(m for m in {FRONT_END_DEPENDENCIES + FRONT_ENDS!r} if m in sys.modules))"
    )
    assert out == "[]"


def test_front_ends_load_on_first_use():
    out = _run(
        "import opforge\n"
        "con = opforge.connect('cpu')\n"
        "print(con.sql('SELECT 1 + 2 AS x').fetchall(), opforge.stream.StreamExecutionEnvironment.__name__,"
        " opforge.sql.connect is opforge.connect, 'placement' in dir(opforge))"
    )
    assert out == "[(3,)] StreamExecutionEnvironment True True"


def test_import_opforge_needs_no_torch():
    assert _run("import sys, opforge\nprint('torch' in sys.modules, 'triton' in sys.modules)") == "False False"


def test_every_public_name_resolves_and_the_first_op_registers_them_all():
    out = _run(
        "import opforge, torch\n"
        "missing = [n for n in opforge.__all__ if getattr(opforge, n, None) is None]\n"
        "print(missing, callable(opforge.softmax))\n"
    )
    assert out == "[] True"
    # one op's first use registers every torch.library op, not only its family's
    out = _run("import opforge, torch\nopforge.add\nprint(torch.ops.opforge.softmax.default.name())")
    assert out == "opforge::softmax"


def test_unknown_attribute_is_an_attribute_error():
    out = _run("import opforge\ntry:\n    opforge.nope\nexcept AttributeError as e:\n    print(e)")
    assert out == "module 'opforge' has no attribute 'nope'"


def test_pd_ctl_command_imports_no_torch():
    """`opforge pd ctl` is a small control-plane client: its process never loads torch (issue 25)."""
    out = _run(
        "import sys\nfrom opforge import cli\n"
        "try:\n    cli.main(['pd', 'ctl', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch loaded:', 'torch' in sys.modules)"
    )
    assert out.endswith("torch loaded: False")


def test_layout_algebra_loads_on_first_use_without_torch():
    """``opforge.layout`` (issue 27) is pure Python: neither ``import opforge`` nor its first use loads torch."""
    out = _run(
        "import sys, opforge\n"
        "before = 'opforge.layout' in sys.modules\n"
        "print(before, str(opforge.layout.composition(opforge.layout.Layout(20, 2), opforge.layout.Layout((5, 4)))),"
        " 'torch' in sys.modules, 'triton' in sys.modules)"
    )
    assert out == "False (5,4):(2,10) False False"
