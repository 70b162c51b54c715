"""The Serving check's launcher: verdicts, JSON shape, idempotent export, timeouts, the report's Serving section.

MindSpore and Serving are not on the controller. The launcher runs each step as ``PYTHON -m msgpu_verify.serving
--child STEP CONFIG``; here PYTHON is a fake interpreter (written per test) that answers each step the way the real
child does in one of several situations (FAKE_SERVING_MODE), including Serving 2.0.2's own refusal text without a
GPU, a child that hangs with a grandchild, one that dies without a word. Every call is logged (FAKE_SERVING_LOG) so a
test can tell which steps really ran. The real children were run against mindspore 2.0.0 + mindspore-serving 2.0.2.
"""

from __future__ import annotations

import ast
import json
import socket
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
    if mode == "missing":
        emit({{"status": "failed", "error": "ModuleNotFoundError: No module named 'mindspore_serving'",
              "missing": "mindspore_serving", "python": sys.executable}})
    emit({{"mindspore": "2.0.0", "mindspore_serving": "2.0.2", "python": sys.executable}})
if step == "export":
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
    digits = [0 for _ in truth] if mode == "badpipe" else truth
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


def test_missing_serving_is_not_installed_and_names_the_stack_variable(env, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SERVING_MODE", "missing")
    code, doc = run_cli(env)
    assert code == 1
    assert doc["verdict"] == "NOT_INSTALLED"
    assert "stack_serving_enabled" in doc["explanation"] and "mindspore_serving" in doc["explanation"]
    assert [doc["steps"][n]["status"] for n in serving.STEPS] == ["failed"] + ["skipped"] * 4
    assert calls(env) == ["import"]


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
    assert calls(env).count("export") == 1
    env["checkpoint"].write_bytes(b"weights-2")  # a new training run
    _, third = run_cli(env)
    assert third["steps"]["export"]["exported"] is True and third["steps"]["export"]["config_written"] is False
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
    """Static: predict_digit(image) registered with outputs digit, score, and the model file the export writes."""
    tree = ast.parse(serving.CONFIG_SOURCE.read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    method = functions[serving.METHOD]
    assert [arg.arg for arg in method.args.args] == serving.INPUTS
    decorator = method.decorator_list[0]
    assert isinstance(decorator, ast.Call) and decorator.func.attr == "register_method"
    assert ast.literal_eval(decorator.keywords[0].value) == serving.OUTPUTS
    assert {"preprocess", "postprocess"} <= set(functions)
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
