"""A project's own ``flows.py`` and ``tasks/`` (Prefect's usual names) on PYTHONPATH, or in the
working directory for ``python -m``, do not take the place of shardflow's packages: `flows.py`
stopped every command with `ModuleNotFoundError: No module named 'flows.cli'; 'flows' is not a
package` (a `tasks.py`: tests/test_import_hygiene.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.paths import ROOT, SHARDFLOW, SPECS


def run(*command: str, cwd, pythonpath: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def prefect_project(tmp_path):
    (tmp_path / "flows.py").write_text("raise SystemExit(\"the project's own flows.py was imported\")\n")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "__init__.py").write_text("raise SystemExit(\"the project's own tasks was imported\")\n")
    return tmp_path


def test_a_prefect_project_on_pythonpath_leaves_the_command_working(tmp_path):
    project = prefect_project(tmp_path)
    r = run(str(SHARDFLOW), "spec", "validate", str(SPECS / "cpu_demo.csv"), cwd=project, pythonpath=str(project))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "8 tables" in r.stdout


def test_python_m_shardflow_in_such_a_project_works_too(tmp_path):
    project = prefect_project(tmp_path)
    r = run(sys.executable, "-m", "shardflow", "plan", "--help", cwd=project, pythonpath=str(ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage: shardflow plan")
