"""Check in a real headless browser that the MLflow dashboard of a sweep opens on its runs table.

The harness tags every experiment it creates `mlflow.experimentKind=custom_model_development`
(electra_ablate.tracking.runs.setup). MLflow 3.17's UI, however, picks an experiment's view from its global
GenAI / Model training switch (browser storage `mlflow.workflowType`, GenAI by default, or the URL query
`workflowType=machine_learning`), not from the tag; so the reports link the dashboard with that query. This
script:

1. runs a miniature sweep with the harness (`python -m electra_ablate.sweep`: two variants, one pre-training
   seed of 4 steps, RTE with two fine-tuning seeds on 32 examples; about two minutes on a laptop CPU), unless
   `--store` names an existing store;
2. starts `mlflow ui` on that store (127.0.0.1, a free port);
3. opens the experiment in headless Chromium (`--dump-dom` and `--screenshot`; Debian package `chromium`), by
   the plain link `/#/experiments/<id>` and by the reports' link (`?workflowType=machine_learning`), and
   checks that the reports' link renders the runs table: the pre-training runs' names are on the page, the
   fine-tuning runs are nested under them (MLflow's parent-run tag) and the experiment carries the kind tag.
   What the plain link shows (the runs or the GenAI overview) is printed, not checked.

    python scripts/dashboard_check.py --out docs/dashboard_runs.png
    python scripts/dashboard_check.py --store sqlite:///outputs/mlflow.db --experiment quick

Exits non-zero, naming what is missing, when a check fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from electra_ablate.tracking import runs as tracking  # noqa: E402

# The tests' miniature sweep, at one pre-training seed.
MINI = REPO / "tests" / "fixtures" / "mini_sweep.yaml"


def run_mini_sweep(workdir: Path, data_dir: Path) -> str:
    sweep_file = workdir / "dashboard.yaml"
    spec = yaml.safe_load(MINI.read_text())
    spec.update(name="dashboard", description="Miniature sweep for the dashboard check", pretrain_seeds=[0])
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "electra_ablate.sweep", f"sweep={sweep_file}", f"paths.root_dir={workdir}",
           f"paths.data_dir={data_dir}", f"report_dir={workdir}/reports"]
    print("running the miniature sweep:", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=workdir, env=env, check=True)
    return f"sqlite:///{workdir}/outputs/mlflow.db"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"mlflow ui did not answer at {url} within {seconds:.0f} s")


def chromium(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        raise SystemExit("no Chromium found: install Debian's package (apt-get install -y chromium)")
    base = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--window-size=1400,800", "--virtual-time-budget=30000", "--run-all-compositor-stages-before-draw"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", help="tracking URI of an existing store (default: run a miniature sweep)")
    parser.add_argument("--experiment", default="dashboard", help="experiment to open (default: dashboard)")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"), help="shared data folder")
    parser.add_argument("--out", default=str(REPO / "docs" / "dashboard_runs.png"), help="screenshot path")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="electra_ablate_dashboard_"))
    uri = args.store or run_mini_sweep(workdir, Path(args.data_dir))
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        raise SystemExit(f"no experiment {args.experiment!r} in {uri}")
    problems = []
    kind = exp.tags.get(tracking.TAG_EXPERIMENT_KIND)
    if kind != tracking.EXPERIMENT_KIND:
        problems.append(f"experiment tag {tracking.TAG_EXPERIMENT_KIND}={kind!r}, expected {tracking.EXPERIMENT_KIND!r}")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = {r.info.run_id: r.info.run_name for r in runs if r.data.tags.get("kind") == "pretrain"}
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in parents]
    if not parents or not children:
        problems.append(f"the store has {len(parents)} pre-training runs and {len(children)} nested fine-tuning runs")

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host",
                               "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_for(f"http://127.0.0.1:{port}/health", 120)
        base = f"http://127.0.0.1:{port}"
        plain = chromium(["--dump-dom", tracking.dashboard_url(base, exp.experiment_id, runs_view=False)]).stdout
        url = tracking.dashboard_url(base, exp.experiment_id)
        dom = chromium(["--dump-dom", url]).stdout
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        shot = chromium([f"--screenshot={args.out}", url])
        if not Path(args.out).is_file():
            problems.append(f"no screenshot written: {shot.stderr[-500:]}")
    finally:
        server.terminate()
        server.wait(timeout=60)
    (workdir / "dom.html").write_text(dom)
    (workdir / "dom_plain_link.html").write_text(plain)
    missing = [name for name in parents.values() if name not in dom]
    if missing:
        problems.append(f"pre-training runs {missing} are not on the page {url} (see {workdir / 'dom.html'})")
    plain_view = "the runs table" if all(name in plain for name in parents.values()) else "not the runs table"
    print(f"store {uri}, experiment {args.experiment!r} (id {exp.experiment_id}): kind tag {kind!r}; "
          f"{len(parents)} pre-training runs with {len(children)} nested fine-tuning runs")
    print(f"plain link /#/experiments/{exp.experiment_id}: {plain_view} (MLflow's GenAI/Model training switch decides)")
    print(f"reports' link {url.removeprefix(base)}: {'the runs table' if not missing else 'NOT the runs table'}; "
          f"screenshot {args.out}")
    if problems:
        raise SystemExit("dashboard check failed:\n- " + "\n- ".join(problems))
    print("dashboard check passed: the reports' link opens the experiment on its runs table")


if __name__ == "__main__":
    main()
