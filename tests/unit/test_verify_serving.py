"""The Serving check's launcher: verdicts, JSON shape, idempotent export, timeouts, the report's Serving section.

MindSpore and Serving are not on the controller. The launcher runs each step as ``PYTHON -m msgpu_verify.serving
--child STEP CONFIG``; here PYTHON is a fake interpreter (written per test) that answers each step the way the real
child does in one of several situations (FAKE_SERVING_MODE), including Serving 2.0.2's own refusal text without a
GPU, a child that hangs with a grandchild, one that dies without a word, Serving missing where MindSpore imports (the
default stack). Every call is logged (FAKE_SERVING_LOG) so a test can tell which steps really ran. The real children
were run against mindspore 2.0.0 + mindspore-serving 2.0.2, and the CPU steps against mindspore-gpu 1.5.1 without
Serving. Some tests below run the real children (``python -m msgpu_verify.serving --child STEP``) against stand-in
packages written per test (STANDIN_*): a mindspore_serving that is missing or whose register keys Python stages as
Serving 2.0.2 does, a mindspore whose GraphCell reports what the pipeline child had loaded, an empty numpy.
"""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from msgpu_verify import report, serving
from msgpu_verify.__main__ import main

# start_servables' RuntimeError on a host without a GPU (mindspore-serving 2.0.2, measured in the sandbox).
REFUSAL = (
    "Fail to start workers: {servable name:lenet5, device id:0, <Raise failed: Not support device type "
    "None(Default) and model type MindIR. Current inference backend: MindSpore. When the inference backend is "
    "MindSpore, Ascend 910/310P/310 and GPU supports MindIR model, and Ascend 310P/310 supports OM model. When the "
    "inference backend is MindSpore Lite, Ascend 310P/310, GPU and CPU support MindIR and MindIR_Lite model "
    "converted by Lite converter tool.>}"
)
LABELS = [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]

FAKE_PYTHON = r"""#!{python}
import json, os, subprocess, sys, time
assert sys.argv[1:4] == ["-m", "msgpu_verify.serving", "--child"], sys.argv
step, config = sys.argv[4], json.loads(sys.argv[5])
mode = os.environ.get("FAKE_SERVING_MODE", "ok")
with open(os.environ["FAKE_SERVING_LOG"], "a") as log:
    log.write(json.dumps([step, config]) + "\n")
MARK = "@@MSGPU_VERIFY_RESULT@@"

def emit(result):
    print("some C++ log line before the result")
    print(MARK + " " + json.dumps(result), flush=True)
    sys.exit(0)

def labels():
    with open(config["labels_file"], "rb") as handle:
        handle.seek(8)
        return list(handle.read(config["count"]))

if step == "import":
    if mode.startswith("missing"):
        result = {{"status": "failed", "error": "ModuleNotFoundError: No module named 'mindspore_serving'",
                  "missing": "mindspore_serving", "python": sys.executable, "mindspore": "1.5.1"}}
        if mode == "missing_nomindspore":
            result.update({{"mindspore": None, "mindspore_error": "ImportError: libcudnn.so.8: cannot open"}})
        emit(result)
    emit({{"mindspore": "2.0.0", "mindspore_serving": "2.0.2", "python": sys.executable}})
if step == "export":
    if mode == "missing_badexport":
        emit({{"status": "failed", "error": "RuntimeError: checkpoint lacks parameters: ['fc3.weight']"}})
    os.makedirs(os.path.dirname(config["mindir"]), exist_ok=True)
    with open(config["mindir"], "wb") as out:
        out.write(b"fake mindir of " + open(config["checkpoint"], "rb").read())
    emit({{"bytes": 42}})
if step == "config":
    if mode == "crash":
        print("Segmentation fault in the servable import", flush=True)
        os._exit(139)
    outputs = ["digit"] if mode == "badconfig" else ["digit", "score"]
    result = {{"api": "fake", "method": "predict_digit", "inputs": ["image"], "outputs": outputs}}
    if mode == "badconfig":
        error = "method predict_digit: outputs ['digit'] (want ['digit', 'score'])"
        result.update({{"status": "failed", "error": error}})
    emit(result)
if step == "pipeline":
    truth = labels()
    digits = [0 for _ in truth] if mode in ("badpipe", "missing_badpipe") else truth
    emit({{"images": len(truth), "digits": digits, "labels": truth, "preprocess_max_abs_diff_vs_bench": 0.012728}})
if step == "server":
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        open(os.environ["FAKE_SERVING_PIDS"], "w").write("%d %d" % (os.getpid(), child.pid))
        time.sleep(3600)
    if mode in ("nogpu", "otherrefusal"):
        text = {refusal!r} if mode == "nogpu" else "Serving Error: servable_config.py import failed: SyntaxError"
        emit({{"status": "refused", "refusal": text, "start_s": 0.7}})
    truth = labels()
    digits = list(truth)
    errors = []
    if mode == "requesterror":
        digits[0] = None
        errors = ["{{'error': 'Preprocess Failed'}}"]
    emit({{"images": len(truth), "digits": digits, "labels": truth, "errors": errors, "start_s": 3.1,
          "latencies_ms": [1.0 + i for i in range(len(truth))]}})
print("unknown step", step)
sys.exit(2)
"""


def free_address() -> str:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"127.0.0.1:{port}"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Path]:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable, refusal=REFUSAL))
    fake.chmod(0o755)
    data = tmp_path / "mnist"
    (data / "test").mkdir(parents=True)
    (data / "test" / serving.TEST_IMAGES).write_bytes(b"\0" * 16 + bytes(784 * len(LABELS)))
    (data / "test" / serving.TEST_LABELS).write_bytes(b"\0" * 8 + bytes(LABELS))
    checkpoint = tmp_path / "lenet5.ckpt"
    checkpoint.write_bytes(b"weights-1")
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_SERVING_LOG", str(log))
    monkeypatch.setenv("FAKE_SERVING_PIDS", str(tmp_path / "pids"))
    monkeypatch.setenv("FAKE_SERVING_MODE", "ok")
    return {"python": fake, "data": data, "checkpoint": checkpoint, "log": log, "root": tmp_path}


def run_cli(env: Dict[str, Path], *extra: str, device: str = "GPU") -> Tuple[int, dict]:
    out = env["root"] / "serving.json"
    argv = [
        "serving",
        "--checkpoint",
        str(env["checkpoint"]),
        "--data",
        str(env["data"]),
        "--servables",
        str(env["root"] / "servables"),
        "--python",
        str(env["python"]),
        "--device",
        device,
        "--nvidia-smi",
        "",
        "--images",
        str(len(LABELS)),
        "--json",
        str(out),
    ]
    if "--address" not in extra:
        argv += ["--address", free_address()]
    code = main(argv + list(extra))
    return code, json.loads(out.read_text())


def calls(env: Dict[str, Path]) -> List[str]:
    if not env["log"].exists():
        return []
    return [json.loads(line)[0] for line in env["log"].read_text().splitlines()]


def test_ok_on_a_gpu_host_has_every_step_timed_and_the_server_numbers(env) -> None:
    code, doc = run_cli(env)
    assert code == 0
    assert doc["verdict"] == "OK", doc["explanation"]
    assert doc["failed_step"] is None
    assert sorted(doc["steps"]) == sorted(serving.STEPS)
    for name, step in doc["steps"].items():
        assert step["status"] == "ok", name
        assert isinstance(step["seconds"], float)
    assert doc["versions"] == {"mindspore": "2.0.0", "mindspore_serving": "2.0.2", "python": sys.executable}
    assert doc["server_accuracy"] == 1.0 and doc["pipeline_accuracy"] == 1.0
    assert doc["steps"]["server"]["agreement_with_pipeline"] == 1.0
    # latencies 1..10 ms: median 5.5, p95 index round(0.95 * 9) = 9 -> 10
    assert doc["latency_ms"] == {"p50": 5.5, "p95": 10.0, "max": 10.0}
    assert doc["not_run"] == []
    assert "digits" not in doc["steps"]["server"] and "labels" not in doc["steps"]["pipeline"]
    assert calls(env) == ["import", "export", "config", "pipeline", "server"]
    config = (env["root"] / "servables" / "lenet5" / "servable_config.py").read_bytes()
    assert config == serving.CONFIG_SOURCE.read_bytes()


def test_no_gpu_is_no_device_with_servings_own_refusal(env, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", "nogpu")
    code, doc = run_cli(env, device="none")
    assert code == 0
    assert doc["verdict"] == "NO_DEVICE"
    assert doc["steps"]["server"]["status"] == "refused"
    assert "Not support device type None(Default) and model type MindIR" in doc["explanation"]
    assert doc["pipeline_accuracy"] == 1.0 and doc["server_accuracy"] is None
    assert len(doc["not_run"]) == 1 and doc["not_run"][0].startswith("server: the servable was not started")
    assert "MindSpore Lite" in doc["not_run"][0]


def test_the_same_refusal_on_a_gpu_host_fails(env, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", "nogpu")
    code, doc = run_cli(env, device="GPU")
    assert code == 1
    assert (doc["verdict"], doc["failed_step"]) == ("FAIL", "server")
    assert "a host with 1 GPU(s)" in doc["explanation"]


def test_another_refusal_without_a_gpu_is_not_excused(env, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", "otherrefusal")
    code, doc = run_cli(env, device="none")
    assert code == 1
    assert (doc["verdict"], doc["failed_step"]) == ("FAIL", "server")
    assert "SyntaxError" in doc["explanation"]


def test_missing_serving_still_runs_the_cpu_steps_and_is_not_installed(env, monkeypatch) -> None:
    """The default stack: MindSpore 1.5.1 imports, Serving does not. Export and pipeline run for real; config and
    server are skipped naming mindspore_serving; the verdict stays NOT_INSTALLED and says how the CPU steps went."""
    monkeypatch.setenv("FAKE_SERVING_MODE", "missing")
    code, doc = run_cli(env, device="none")
    assert code == 1
    assert (doc["verdict"], doc["failed_step"]) == ("NOT_INSTALLED", "import")
    assert calls(env) == ["import", "export", "pipeline"]
    steps = doc["steps"]
    assert [steps[n]["status"] for n in serving.STEPS] == ["failed", "ok", "skipped", "ok", "skipped"]
    for name in ("config", "server"):
        assert "needs mindspore_serving, which is not installed" in steps[name]["reason"], steps[name]
    assert [note.split(":")[0] for note in doc["not_run"]] == ["config", "server"]
    assert "stack_serving_enabled" in doc["explanation"] and "mindspore_serving" in doc["explanation"]
    assert "the CPU steps (export, pipeline) passed" in doc["explanation"]
    assert "MindSpore 1.5.1, accuracy 1.0 on 10 test image(s)" in doc["explanation"]
    assert doc["cpu_steps"] == {"export": "ok", "pipeline": "ok", "passed": True}
    assert doc["pipeline_accuracy"] == 1.0 and doc["server_accuracy"] is None
    assert doc["versions"]["mindspore"] == "1.5.1" and doc["mindspore_serving_version"] is None
    servable = env["root"] / "servables" / "lenet5"
    assert (servable / serving.PIPELINE_FILE).read_bytes() == serving.PIPELINE_SOURCE.read_bytes()
    assert (servable / "servable_config.py").read_bytes() == serving.CONFIG_SOURCE.read_bytes()


@pytest.mark.parametrize(
    ("mode", "step", "words", "ran"),
    [
        ("missing_badexport", "export", "checkpoint lacks parameters", ["import", "export"]),
        ("missing_badpipe", "pipeline", "--min-accuracy", ["import", "export", "pipeline"]),
    ],
)
def test_without_serving_a_broken_cpu_step_is_still_a_fail(env, monkeypatch, mode, step, words, ran) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", mode)
    code, doc = run_cli(env, device="none")
    assert code == 1
    assert (doc["verdict"], doc["failed_step"]) == ("FAIL", step)
    assert words in doc["explanation"]
    assert calls(env) == ran
    assert doc["cpu_steps"]["passed"] is False and doc["cpu_steps"][step] == "failed"
    assert doc["steps"]["server"]["status"] == "skipped"


def test_missing_serving_and_mindspore_runs_nothing_else(env, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", "missing_nomindspore")
    code, doc = run_cli(env)
    assert (code, doc["verdict"]) == (1, "NOT_INSTALLED")
    assert [doc["steps"][n]["status"] for n in serving.STEPS] == ["failed"] + ["skipped"] * 4
    assert calls(env) == ["import"]
    assert "the CPU steps (export, pipeline) did not run: MindSpore does not import either" in doc["explanation"]
    assert "libcudnn.so.8" in doc["explanation"]
    assert doc["cpu_steps"] == {"export": "skipped", "pipeline": "skipped", "passed": False}


def test_a_hanging_server_is_hang_and_its_process_group_is_killed(env, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", "hang")
    started = time.monotonic()
    code, doc = run_cli(env, "--timeout", "5")
    assert time.monotonic() - started < 40
    assert code == 1
    assert (doc["verdict"], doc["failed_step"]) == ("HANG", "server")
    assert doc["steps"]["server"]["status"] == "timeout"
    for pid in map(int, (env["root"] / "pids").read_text().split()):
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


def test_a_child_that_dies_without_a_result_fails_its_step_with_its_output(env, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", "crash")
    code, doc = run_cli(env)
    assert code == 1
    assert (doc["verdict"], doc["failed_step"]) == ("FAIL", "config")
    assert "exited with 139" in doc["explanation"]
    assert "Segmentation fault" in doc["steps"]["config"]["output_tail"]
    assert doc["steps"]["pipeline"]["status"] == "skipped"


@pytest.mark.parametrize(
    ("mode", "step", "words"),
    [
        ("badconfig", "config", "outputs ['digit']"),
        ("badpipe", "pipeline", "--min-accuracy"),
        ("requesterror", "server", "1 of 10 request(s) failed"),
    ],
)
def test_wrong_answers_fail_the_step_that_gave_them(env, monkeypatch, mode, step, words) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", mode)
    code, doc = run_cli(env)
    assert code == 1
    assert (doc["verdict"], doc["failed_step"]) == ("FAIL", step)
    assert words in doc["explanation"]


def test_a_missing_checkpoint_fails_before_any_export(env) -> None:
    env["checkpoint"].unlink()
    code, doc = run_cli(env)
    assert (code, doc["verdict"], doc["failed_step"]) == (1, "FAIL", "export")
    assert "--save-checkpoint" in doc["explanation"]
    assert calls(env) == ["import"]


def test_missing_mnist_names_the_files(env) -> None:
    (env["data"] / "test" / serving.TEST_LABELS).unlink()
    code, doc = run_cli(env)
    assert (code, doc["verdict"], doc["failed_step"]) == (1, "FAIL", "pipeline")
    assert serving.TEST_LABELS in doc["explanation"] and "msgpu_verify mnist" in doc["explanation"]


def test_export_is_idempotent_and_follows_the_checkpoint(env) -> None:
    _, first = run_cli(env)
    assert first["steps"]["export"]["changed"] is True
    _, second = run_cli(env)
    assert second["steps"]["export"] == {**second["steps"]["export"], "changed": False, "exported": False}
    assert second["steps"]["export"]["config_written"] is False
    assert second["steps"]["export"]["pipeline_written"] is False
    assert calls(env).count("export") == 1
    env["checkpoint"].write_bytes(b"weights-2")  # a new training run
    _, third = run_cli(env)
    assert third["steps"]["export"]["exported"] is True and third["steps"]["export"]["config_written"] is False
    assert third["steps"]["export"]["pipeline_written"] is False
    mindir = Path(third["servable"]["mindir"])
    assert mindir.read_bytes() == b"fake mindir of weights-2"
    assert json.loads((mindir.parent / serving.STAMP).read_text())["mindspore"] == "2.0.0"


def test_a_busy_address_fails_the_server_step_and_says_which_setting(env) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        code, doc = run_cli(env, "--address", f"127.0.0.1:{holder.getsockname()[1]}")
    finally:
        holder.close()
    assert (code, doc["verdict"], doc["failed_step"]) == (1, "FAIL", "server")
    assert "verify_serving_address" in doc["explanation"]
    assert "server" not in calls(env)


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("--images", "0", "from 1 to 10000"),
        ("--images", "many", "from 1 to 10000"),
        ("--timeout", "1", ">= 5"),
        ("--min-accuracy", "97", "from 0 to 1"),
        ("--device", "CPU", "choose from"),
    ],
)
def test_bad_options_are_refused_with_what_is_allowed(env, capsys, option, value, allowed) -> None:
    with pytest.raises(SystemExit) as stopped:
        run_cli(env, option, value)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert option in error and allowed in error


def test_address_problem_rejects_malformed_addresses() -> None:
    assert "HOST:PORT" in serving.address_problem("5500")
    assert "HOST:PORT" in serving.address_problem("127.0.0.1:99999")
    assert serving.address_problem(free_address()) is None


def test_the_servable_config_declares_what_the_launcher_checks() -> None:
    """Static: predict_digit(image) registered with outputs digit, score, and the model file the export writes;
    preprocess and postprocess defined in the pipeline file (numpy only), which the config loads by its name."""
    tree = ast.parse(serving.CONFIG_SOURCE.read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    method = functions[serving.METHOD]
    assert [arg.arg for arg in method.args.args] == serving.INPUTS
    decorator = method.decorator_list[0]
    assert isinstance(decorator, ast.Call) and decorator.func.attr == "register_method"
    assert ast.literal_eval(decorator.keywords[0].value) == serving.OUTPUTS
    assigned = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if hasattr(t, "id")}
    assert {"preprocess", "postprocess"} <= assigned
    assert f'"{serving.PIPELINE_FILE}"' in serving.CONFIG_SOURCE.read_text()
    pipeline = ast.parse(serving.PIPELINE_SOURCE.read_text())
    assert {"preprocess", "postprocess"} <= {n.name for n in pipeline.body if isinstance(n, ast.FunctionDef)}
    imported = {a.name for n in ast.walk(pipeline) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(pipeline) if isinstance(n, ast.ImportFrom)}
    assert imported == {"numpy"}, imported  # the CPU steps run it without Serving
    assert "msgpu_verify" not in serving.PIPELINE_SOURCE.read_text().split('"""')[2]  # deployed alone
    declared = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "declare_model"
        for node in node.keywords
        if node.arg == "model_file"
    ]
    assert [ast.literal_eval(v) for v in declared] == [serving.MINDIR]
    assert "msgpu_verify" not in serving.CONFIG_SOURCE.read_text().split('"""')[2]  # deployed alone


def test_the_launcher_module_imports_no_mindspore() -> None:
    tree = ast.parse(Path(serving.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
    assert not names & {"mindspore", "mindspore_serving", "numpy"}


def host_file(folder: Path, name: str, serving_doc) -> None:
    record = {"host": name, "judge": {"verdict": "NO_GPU", "explanation": "no GPU", "accept": ["NO_GPU"]}}
    if serving_doc != "absent":
        record["serving"] = serving_doc
    (folder / f"{name}.json").write_text(json.dumps(record))


def test_report_has_a_serving_section_only_when_a_host_has_a_serving_result(env, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", "nogpu")
    _, doc = run_cli(env, device="none")
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    host_file(hosts, "sandbox1", doc)
    host_file(hosts, "sandbox2", None)  # the role ran but fetched nothing
    host_file(hosts, "plain", "absent")
    md, html_path, summary_path = report.write_report(hosts, tmp_path / "out")
    text = md.read_text()
    assert "## MindSpore Serving" in text
    assert "| sandbox1 | **NO_DEVICE** | 2.0.2 | 100.00 % (pipeline (CPU, no server), 10 images) |" in text
    assert "| sandbox2 | **MISSING** |" in text and "| plain |" not in text.split("## MindSpore Serving")[1]
    assert "Not support device type" in text
    page = html_path.read_text()
    assert "MindSpore Serving" in page and "NO_DEVICE" in page
    rows = json.loads(summary_path.read_text())["fleet"]["serving"]
    assert [r["host"] for r in rows] == ["sandbox1", "sandbox2"]
    assert rows[0]["accuracy"] == 1.0 and rows[0]["accuracy_source"].startswith("pipeline")
    lines = report.fleet_lines(json.loads(summary_path.read_text())["fleet"])
    assert any(line.startswith("serving sandbox1: NO_DEVICE") for line in lines)

    plain = tmp_path / "plain"
    plain.mkdir()
    host_file(plain, "plain", "absent")
    md, html_path, summary_path = report.write_report(plain, tmp_path / "out2")
    assert "Serving" not in md.read_text() and "Serving" not in html_path.read_text()
    assert "serving" not in json.loads(summary_path.read_text())["fleet"]


def test_report_escapes_serving_text(tmp_path) -> None:
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    host_file(hosts, "h", {"verdict": "FAIL", "explanation": "<script>x</script>", "not_run": ["<b>y</b>"]})
    _, html_path, _ = report.write_report(hosts, tmp_path / "out")
    page = html_path.read_text()
    assert "<script>x" not in page and "&lt;script&gt;x" in page and "&lt;b&gt;y" in page


def test_bench_passes_the_checkpoint_to_its_child_as_an_absolute_path(tmp_path, monkeypatch) -> None:
    from msgpu_verify import bench, mnist

    seen = {}

    def fake_run(kind, config, timeout, python):
        seen.update(config)
        return {"checkpoint": config["checkpoint"], "images_per_s": 1.0}

    monkeypatch.setattr(bench, "_run", fake_run)
    monkeypatch.setattr(mnist, "is_complete", lambda _: True)
    monkeypatch.chdir(tmp_path)  # the child runs in /, so a relative path must not reach it
    result = bench.run_bench(data=str(tmp_path), quick=True, checkpoint="out/lenet5.ckpt")
    assert seen["checkpoint"] == str(tmp_path / "out" / "lenet5.ckpt")
    assert result["checkpoint"] == seen["checkpoint"]
    bench.run_bench(data=str(tmp_path), quick=True)
    assert seen["checkpoint"] is None


# --- the MindSpore names the verification package uses, in every release (real wheels' modules, recorded) ----------

NAMES = json.loads((Path(__file__).resolve().parent / "data" / "run_check_texts.json").read_text())["releases"]


def _read_releases(version: str) -> List[str]:
    """The releases whose wheels were read for ``version``: itself, or PyPI's neighbours of one PyPI lacks."""
    record = NAMES[version]
    return [version] if record.get("wheel") else list(record["bracketed_by"])


@pytest.mark.parametrize("version", sorted(v for v, r in NAMES.items() if r["catalog"]))
def test_every_mindspore_name_the_package_uses_exists_in_every_catalog_release(version) -> None:
    """`ms.set_context(mode=ms.GRAPH_MODE)` is 2.x only: mindspore-gpu 1.5.1's top level has neither (its
    __init__ exports run_check, common, train and log's __all__); `mindspore.context` has both in every release."""
    from testbed import run_check_texts

    missing = [
        f"{ref.file}:{ref.line} {ref.text()} ({why}, mindspore {read})"
        for read in _read_releases(version)
        for ref in run_check_texts.references()
        for found, why in [run_check_texts.check_against(NAMES[read], ref)]
        if not found
    ]
    assert missing == []


def test_the_name_check_would_catch_the_2x_only_top_level_context_calls() -> None:
    from testbed import run_check_texts

    used = run_check_texts.Reference("serving.py", 1, "mindspore", ("set_context",))
    assert run_check_texts.check_against(NAMES["1.5.1"], used) == (False, "mindspore has no set_context")
    assert run_check_texts.check_against(NAMES["2.0.0"], used) == (True, "found")
    for name in ("set_context", "GRAPH_MODE"):
        assert name in NAMES["1.5.1"]["api"]["mindspore.context"]["names"]
    serving_refs = {r.text() for r in run_check_texts.references() if r.file == "serving.py"}
    assert "mindspore.context.set_context" in serving_refs and "mindspore.set_context" not in serving_refs


def test_children_get_absolute_paths_when_the_options_are_relative(env, monkeypatch) -> None:
    # The children run in DIR/../serving-work (Serving writes its logs there): a relative path would point elsewhere.
    monkeypatch.chdir(env["root"])
    code, doc = run_cli(
        env,
        "--checkpoint",
        env["checkpoint"].name,
        "--data",
        env["data"].name,
        "--servables",
        "servables",
    )
    assert (code, doc["verdict"]) == (0, "OK"), doc["explanation"]
    for step, config in (json.loads(line) for line in env["log"].read_text().splitlines()):
        for key in ("checkpoint", "mindir", "servables", "images_file", "labels_file", "data"):
            if key in config:
                assert Path(config[key]).is_absolute(), (step, key, config[key])


# --- the real children against stand-in packages: the split servable without and with a Serving register ---------

# mindspore_serving as where it is not installed: importing it fails like a missing package, and says so in a log.
STANDIN_NO_SERVING = {
    "mindspore_serving/__init__.py": (
        "import os\n"
        "with open(os.environ['STANDIN_SERVING_LOG'], 'a') as log:\n"
        "    log.write('import mindspore_serving\\n')\n"
        "raise ModuleNotFoundError(\"No module named 'mindspore_serving'\", name='mindspore_serving')\n"
    ),
}
# numpy: the pipeline file and the children import it at the top; these tests stop before any array is made.
STANDIN_NUMPY = {"numpy/__init__.py": "STANDIN = True\n"}
# mindspore 1.5.1's names the children touch (mindspore.context, not the 2.x top level). GraphCell is built right
# after the pipeline child has loaded the servable's pre/post-processing: it reports what was loaded and stops.
STANDIN_MINDSPORE = {
    "mindspore/__init__.py": (
        "from . import context, nn\n__version__ = '1.5.1'\n\n\ndef load(path):\n    return path\n"
    ),
    "mindspore/context.py": "GRAPH_MODE = 0\n\n\ndef set_context(**kwargs):\n    pass\n",
    "mindspore/nn.py": (
        "import json, os, sys\n\n\n"
        "class GraphCell:\n"
        "    def __init__(self, graph):\n"
        "        modules = {name: getattr(m, '__file__', None) for name, m in sys.modules.items()\n"
        "                   if name in ('lenet5_pipeline', 'servable_config', 'mindspore_serving')}\n"
        "        pre = sys.modules['lenet5_pipeline'].preprocess if 'lenet5_pipeline' in sys.modules else None\n"
        "        log = os.environ['STANDIN_SERVING_LOG']\n"
        "        seen = {'graph': graph, 'modules': modules, 'preprocess_file': pre and pre.__code__.co_filename,\n"
        "                'serving_imports': open(log).read().split('\\n')[:-1] if os.path.exists(log) else []}\n"
        "        raise RuntimeError('STANDIN ' + json.dumps(seen))\n"
    ),
}
# Serving's register as 2.0.2 has it (server/register/method.py, utils.py, stage_function.py): add_stage takes a
# Model or a function (inspect.isfunction), keys a function by <folder of the servable_config.py on the call stack>.
# <function __name__> and keeps the function object; register_method runs the method once and hands its signature
# to ServableRegister_.register_method. STAGES records each stage function's key and the file it comes from.
STANDIN_SERVING = {
    "mindspore_serving/__init__.py": "__version__ = '2.0.2'\n",
    "mindspore_serving/client.py": "",
    "mindspore_serving/server/__init__.py": "from . import register\n",
    "mindspore_serving/server/register/__init__.py": (
        "from .method import add_stage, register_method\nfrom .model import declare_model\n"
    ),
    "mindspore_serving/server/register/model.py": (
        "class Model:\n    def __init__(self, model_file):\n        self.model_file = model_file\n\n\n"
        "def declare_model(model_file, model_format, with_batch_dim=True):\n    return Model(model_file)\n"
    ),
    "mindspore_serving/server/register/method.py": """
import inspect
import os
from types import SimpleNamespace

from .model import Model

STAGES = {}


class ServableRegister_:
    @staticmethod
    def register_method(signature):
        pass


def get_servable_dir():
    for item in inspect.stack():
        if item.filename.endswith("servable_config.py"):
            return os.path.split(os.path.split(os.path.realpath(item.filename))[0])[1]
    raise RuntimeError("Failed to obtain the directory of servable_config.py")


def add_stage(stage, *args, outputs_count, batch_size=None, tag=None):
    if inspect.isfunction(stage):
        STAGES[get_servable_dir() + "." + stage.__name__] = stage.__code__.co_filename
    elif not isinstance(stage, Model):
        raise RuntimeError("the parameter 'stage' of add_stage must be function or Model")
    return tuple(object() for _ in range(outputs_count)) if outputs_count > 1 else object()


def register_method(output_names):
    def wrap(func):
        inputs = list(inspect.signature(func).parameters)
        func(*inputs)
        ServableRegister_.register_method(
            SimpleNamespace(servable_name=get_servable_dir(), method_name=func.__name__, inputs=inputs,
                            outputs=list(output_names))
        )
        return func
    return wrap
""",
}


def standins(root: Path, *packages: Dict[str, str]) -> Path:
    for files in packages:
        for name, text in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root


@pytest.fixture
def deployed(env) -> Path:
    """The servables folder as the launcher's export step leaves it (both servable files, the MindIR's place)."""
    code, doc = run_cli(env)
    assert (code, doc["verdict"]) == (0, "OK"), doc["explanation"]
    return env["root"] / "servables"


def real_child(monkeypatch, tmp_path: Path, step: str, config: dict, *packages: Dict[str, str]) -> dict:
    """The real ``python -m msgpu_verify.serving --child STEP`` (this Python) with the stand-ins on its path."""
    monkeypatch.setenv("PYTHONPATH", str(standins(tmp_path / "standins", *packages)))
    monkeypatch.setenv("STANDIN_SERVING_LOG", str(tmp_path / "serving-imports.log"))
    return serving.Runner(sys.executable, 60, tmp_path / "work")(step, config)


def test_the_import_child_reports_mindspore_when_serving_is_missing(monkeypatch, tmp_path) -> None:
    result = real_child(monkeypatch, tmp_path, "import", {}, STANDIN_NO_SERVING, STANDIN_MINDSPORE)
    assert result["status"] == "failed" and result["missing"] == "mindspore_serving", result
    assert result["mindspore"] == "1.5.1" and result["python"] == sys.executable


def test_the_pipeline_child_loads_the_pipeline_file_without_serving(env, deployed, monkeypatch, tmp_path) -> None:
    """Where mindspore_serving cannot be imported, the real pipeline child still gets the servable's own
    preprocess/postprocess: the deployed lenet5_pipeline.py, not servable_config.py, and no Serving import."""
    config = {**serving._data_config(env["data"], 3), "servables": str(deployed)}
    packages = (STANDIN_NO_SERVING, STANDIN_MINDSPORE, STANDIN_NUMPY)
    result = real_child(monkeypatch, tmp_path, "pipeline", config, *packages)
    assert result["status"] == "failed" and "STANDIN " in result["error"], result
    seen = json.loads(result["error"].split("STANDIN ", 1)[1])
    pipeline = str(deployed / "lenet5" / serving.PIPELINE_FILE)
    assert seen["modules"] == {"lenet5_pipeline": pipeline}, seen
    assert seen["preprocess_file"] == pipeline
    assert seen["serving_imports"] == []
    assert seen["graph"] == str(deployed / "lenet5" / "1" / serving.MINDIR)


def test_the_config_child_passes_with_a_register_that_keys_stages_like_serving(deployed, monkeypatch, tmp_path) -> None:
    result = real_child(monkeypatch, tmp_path, "config", {"servables": str(deployed)}, STANDIN_SERVING, STANDIN_NUMPY)
    assert result["status"] == "ok", result
    assert (result["method"], result["inputs"], result["outputs"]) == (serving.METHOD, serving.INPUTS, serving.OUTPUTS)
    assert result["registered"][0]["servable"] == "lenet5"


def test_the_config_child_refuses_stages_that_are_not_the_deployed_pipeline(deployed, monkeypatch, tmp_path) -> None:
    config_file = deployed / "lenet5" / "servable_config.py"
    config_file.write_text(config_file.read_text() + "\n\ndef preprocess(image):\n    return image\n")
    result = real_child(monkeypatch, tmp_path, "config", {"servables": str(deployed)}, STANDIN_SERVING, STANDIN_NUMPY)
    assert result["status"] == "failed"
    assert f"servable_config.py's preprocess() comes from {config_file}" in result["error"], result


@pytest.mark.parametrize("how", ["serving", "check"])
def test_serving_gets_the_pipeline_files_functions_however_it_imports_the_config(deployed, tmp_path, how) -> None:
    """Serving 2.0.2's worker (server/worker/_worker.py, _load_servable_config) appends the servables folder to
    sys.path and imports ``lenet5.servable_config``; the check imports it as ``servable_config`` with its own folder
    on sys.path. Either way the stages are keyed lenet5.preprocess / lenet5.postprocess and are the functions of
    the deployed lenet5_pipeline.py (the worker calls the function objects it keeps)."""
    packages = standins(tmp_path / "standins", STANDIN_SERVING, STANDIN_NUMPY)
    load = {
        "serving": f"sys.path.append({str(deployed)!r}); __import__('lenet5.servable_config')",
        "check": f"from msgpu_verify import serving; serving._load_servable_config({str(deployed)!r})",
    }[how]
    script = (
        f"import json, sys\nsys.path[:0] = [{str(packages)!r}, {str(Path(serving.__file__).parent.parent)!r}]\n"
        f"{load}\n"
        "from mindspore_serving.server.register import method\n"
        "print(json.dumps(method.STAGES))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    pipeline = str(deployed / "lenet5" / serving.PIPELINE_FILE)
    assert json.loads(proc.stdout) == {"lenet5.preprocess": pipeline, "lenet5.postprocess": pipeline}


def test_a_changed_pipeline_file_is_deployed_again_without_a_new_export(env) -> None:
    run_cli(env)
    deployed = env["root"] / "servables" / "lenet5" / serving.PIPELINE_FILE
    deployed.write_text("# edited by hand\n")
    _, doc = run_cli(env)
    export = doc["steps"]["export"]
    assert (export["exported"], export["pipeline_written"], export["config_written"]) == (False, True, False)
    assert export["changed"] is True
    assert deployed.read_bytes() == serving.PIPELINE_SOURCE.read_bytes()
    assert calls(env).count("export") == 1
