"""Classes of hostile input to `tokdyn probe` and `tokdyn record-offline` (docs/reliability.md):
each test stands for a class, and every failure is one line naming the file or field, exit 1.

- an unreadable checkpoint (random bytes, text, cut short, another format) is "not a readable
  torch checkpoint", never a pickle warning, a refusal to run code, or an errno;
- a device that cannot hold weights is refused before any store is made;
- text that is not valid Unicode is read as text files are (U+FFFD), and the probe's numbers
  and output paths are checked before any work;
- a model spec, config or manifest value of the wrong type or beyond int64 names its field;
- a model whose vocabulary lacks a probe token id (at any position) names the checkpoint.
"""

from __future__ import annotations

import io
import json
import random
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as hs

import tokdyn
from offline_fixtures import CONFIG, SPEC, make_model, make_probe, save_safetensors, save_torch, write_spec
from reliability_fixtures import cli_error_line, run_cli
from tokdyn.corpus import jsonl_documents
from tokdyn.errors import InputError, UnsafeFileError
from tokdyn.probe import ProbeSet
from tokdyn.record.offline import read_state_dict, record_offline
from tokdyn.tokenizer import ByteTokenizer, HFTokenizer

INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def probe_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "probe.zarr"
    tokdyn.open_store(path, make_probe(), mode="w")
    return path


def record(folder, out, probe_store, capsys, *extra) -> tuple[int, str]:
    return run_cli(["record-offline", "--checkpoints", str(folder), "--out", str(out), "--run", "r", "--probe", str(probe_store),
                    "--no-progress", "--workers", "1", *extra], capsys)  # fmt: skip


def checkpoint_folder(tmp_path, data: bytes | None = None, *, name: str = "step_1.pt", spec=SPEC):
    """A folder with a model spec beside one checkpoint: ``data`` as its bytes, else a real one."""
    folder = tmp_path / "ckpts"
    folder.mkdir(exist_ok=True)
    if spec is not None:
        write_spec(folder, spec)
    if data is None:
        save_torch(make_model(0), folder / name)
    else:
        (folder / name).write_bytes(data)
    return folder


def _saved(**kw) -> bytes:
    buf = io.BytesIO()
    torch.save(make_model(0).state_dict(), buf, **kw)
    return buf.getvalue()


def _zip_without_pickle() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/notes.txt", "not a checkpoint")
    return buf.getvalue()


_rng = random.Random(0)
ZIPPED, LEGACY = _saved(), _saved(_use_new_zipfile_serialization=False)
UNREADABLE = {
    "random bytes": bytes(_rng.getrandbits(8) for _ in range(4096)),
    "random bytes after a pickle header of protocol 201": b"\x80\xc9" + bytes(_rng.getrandbits(8) for _ in range(500)),
    "random bytes after a protocol-2 pickle header": b"\x80\x02" + bytes(_rng.getrandbits(8) for _ in range(500)),
    "plain text": b"hello, this is not a checkpoint\n",
    "empty": b"",
    "truncated zip checkpoint": ZIPPED[: len(ZIPPED) // 2],
    "truncated legacy checkpoint": LEGACY[: len(LEGACY) // 2],
    "zip archive without data.pkl": _zip_without_pickle(),
    "json": json.dumps({"weights": [1, 2, 3]}).encode(),
}


@pytest.mark.parametrize("what", list(UNREADABLE))
def test_an_unreadable_checkpoint_is_one_line_naming_it(what, tmp_path, probe_store, capsys):
    folder = checkpoint_folder(tmp_path, UNREADABLE[what])
    save_torch(make_model(0), folder / "step_2.pt")  # step_1.pt is not the newest: not a save still being written
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    line = cli_error_line(err)  # no torch warning lines before it
    assert code == 1
    assert "step_1.pt is not a readable torch checkpoint (corrupt, or another format)" in line, line
    assert "unpickling" not in line and "Errno" not in line, line
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.parametrize("protocol", [4, 5])
def test_a_checkpoint_pickled_with_a_later_protocol_says_so(protocol, tmp_path, probe_store, capsys):
    folder = checkpoint_folder(tmp_path, _saved(pickle_protocol=protocol))
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    assert code == 1
    assert f"step_1.pt is pickled with protocol {protocol}" in cli_error_line(err)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=hs.one_of(hs.binary(max_size=600), hs.binary(max_size=600).map(lambda b: b"\x80\x02" + b),
                      hs.tuples(hs.integers(0, len(ZIPPED)), hs.integers(0, 255), hs.integers(0, len(ZIPPED) - 1))
                      .map(lambda t: _damaged(ZIPPED, *t)),
                      hs.tuples(hs.integers(0, len(LEGACY)), hs.integers(0, 255), hs.integers(0, len(LEGACY) - 1))
                      .map(lambda t: _damaged(LEGACY, *t))))  # fmt: skip
# found by the test below: a legacy file's later pickle declaring protocol 0 (torch warned, then
# failed on the truncated pickle)
@example(data=b"\x80\x02\x8a\n" + bytes(10) + b"M\x00\x00q\x00X\x05\x00\x00\x00abcdeq\x00\x80\x00")
def test_any_bytes_read_as_a_state_dict_or_an_input_error(data, tmp_path_factory):
    """Whatever the bytes, reading them gives a state dict or an InputError naming the file,
    with no warning (the CLI would print each warning as a line before the error)."""
    path = tmp_path_factory.mktemp("fuzz") / "step_1.pt"
    path.write_bytes(data)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        try:
            read_state_dict(path)
        except InputError as exc:  # UnsafeFileError is one too
            assert str(path) in str(exc)
    assert not [w for w in caught if "pickle protocol" in str(w.message)]


def _damaged(data: bytes, cut: int, byte: int, at: int) -> bytes:
    """``data`` with one byte changed, cut to ``cut`` bytes."""
    b = bytearray(data)
    b[at] = byte
    return bytes(b[:cut])


def test_a_pickle_that_runs_code_is_still_refused_as_unsafe(tmp_path):
    import pathlib

    class Touch:
        def __reduce__(self):
            return (pathlib.Path.touch, (tmp_path / "pwned",))

    sd = dict(make_model(0).state_dict())
    sd["extra"] = Touch()
    torch.save(sd, tmp_path / "step_1.pt")
    with pytest.raises(UnsafeFileError, match=r"step_1\.pt cannot be loaded without unpickling"):
        read_state_dict(tmp_path / "step_1.pt")
    assert not (tmp_path / "pwned").exists()


SAFETENSORS_DAMAGE = {
    "random bytes": lambda good: bytes(random.Random(1).getrandbits(8) for _ in range(300)),
    "cut short": lambda good: good[: len(good) // 2],
    "empty": lambda good: b"",
}


@pytest.mark.parametrize("what", list(SAFETENSORS_DAMAGE))
def test_an_unreadable_safetensors_file_is_one_line_naming_it(what, tmp_path, probe_store, capsys):
    folder = checkpoint_folder(tmp_path)
    (folder / "step_1.pt").unlink()
    save_safetensors(make_model(0), folder / "step_1.safetensors")
    good = (folder / "step_1.safetensors").read_bytes()
    (folder / "step_1.safetensors").write_bytes(SAFETENSORS_DAMAGE[what](good))
    save_safetensors(make_model(0), folder / "step_2.safetensors")  # not the newest: not a save still being written
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    assert code == 1
    assert "step_1.safetensors is not a readable safetensors file" in cli_error_line(err)


def _hf_folder(tmp_path):
    pytest.importorskip("transformers")
    from offline_fixtures import make_hf_model

    folder = tmp_path / "hf" / "checkpoint-1"
    make_hf_model(0).save_pretrained(folder)
    return folder


HF_DAMAGE = {
    "random weights": (lambda f: (f / "model.safetensors").write_bytes(bytes(range(256)) * 3), "model.safetensors|checkpoint-1"),
    "weights cut short": (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:200]), "checkpoint-1"),
    "config not JSON": (lambda f: (f / "config.json").write_text("{nope"), r"config\.json"),
    "config a number": (lambda f: (f / "config.json").write_text("5"), r"config\.json.*got a number"),
    "unknown model_type": (lambda f: (f / "config.json").write_text('{"model_type": "nosuch"}'), r"config\.json.*'nosuch'"),
    "no causal LM": (lambda f: (f / "config.json").write_text('{"model_type": "clip"}'), r"config\.json.*'clip' has no causal"),
    "config value of the wrong type": (lambda f: (f / "config.json").write_text(
        json.dumps({**json.loads((f / "config.json").read_text()), "n_embd": "abc"})), r"checkpoint-1.*n_embd"),
    "bin of random bytes": (lambda f: ((f / "model.safetensors").unlink(), (f / "pytorch_model.bin").write_bytes(b"\x80\x02junk")),
                            r"pytorch_model\.bin is not a readable torch checkpoint"),
}  # fmt: skip


@pytest.mark.parametrize("what", list(HF_DAMAGE))
def test_a_damaged_hugging_face_folder_is_one_short_line_naming_it(what, tmp_path, probe_store, capsys):
    folder = _hf_folder(tmp_path)
    damage, pattern = HF_DAMAGE[what]
    damage(folder)
    code, err = record(folder.parent, tmp_path / "o.zarr", probe_store, capsys)
    line = cli_error_line(err)
    assert code == 1 and len(line) < 500, line
    assert __import__("re").search(pattern, line), line


@pytest.mark.parametrize("field, value", [("n_embd", "abc"), ("n_layer", "2"), ("layer_norm_epsilon", "1e-5"),
                                          ("initializer_range", ""), ("n_positions", "64\n"), ("n_head", True)])  # fmt: skip
def test_text_or_a_truth_value_where_the_config_has_a_number_is_named_on_every_transformers(field, value, tmp_path, probe_store, capsys):
    """transformers 4.x built the model and failed in torch without naming the field; the line
    names it whatever the version, and text where the config has text or None is left alone."""
    folder = _hf_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    code, err = record(folder.parent, tmp_path / "o.zarr", probe_store, capsys)
    line = cli_error_line(err)
    what = "true or false" if isinstance(value, bool) else "text"
    assert code == 1 and f"config.json: {field} is {json.dumps(value)}, {what} where GPT2Config takes a number" in line, line
    (folder / "config.json").write_text(json.dumps({**config, "activation_function": "gelu_new", "n_inner": None}))
    assert record(folder.parent, tmp_path / "o2.zarr", probe_store, capsys)[0] == 0


# -- devices ---------------------------------------------------------------------------------


DEVICES = {
    "bogus": "not a torch device",
    "meta": "meta device holds no data",
    "fpga": "cannot be used on this machine",
    "cuda:99": "cuda:99",
}
if not torch.cuda.is_available():
    DEVICES["cuda"] = "CUDA is not available"


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_device_that_cannot_hold_weights_is_refused_before_any_work(device, tmp_path, probe_store, capsys):
    folder = checkpoint_folder(tmp_path)
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys, "--device", device)
    line = cli_error_line(err)
    assert code == 1 and DEVICES[device] in line, line
    assert "internal error" not in line
    assert not (tmp_path / "o.zarr").exists()


# -- model specs, configs and manifests ------------------------------------------------------


BAD_CONFIG_VALUES = [("n_embd", "abc"), ("dropout", "x"), ("n_layer", None), ("n_embd", 16.5), ("vocab_size", True),
                     ("n_head", [2]), ("context", -3), ("dropout", 1.5), ("n_layer", 10**30), ("vocab_size", 2**24 - 1)]  # fmt: skip


@pytest.mark.parametrize("field, value", BAD_CONFIG_VALUES, ids=lambda v: repr(v))
def test_a_model_config_value_of_the_wrong_type_names_the_field(field, value, tmp_path, probe_store, capsys):
    spec = {"type": "tinygpt", "config": {**CONFIG.to_dict(), field: value}}
    if (field, value) == ("vocab_size", 2**24 - 1):  # each in range, together far too large
        spec["config"].update(n_embd=2**14, n_head=2)
    folder = checkpoint_folder(tmp_path, spec=spec)
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    line = cli_error_line(err)
    assert code == 1 and "tokdyn_model.json" in line and (field in line or "parameters" in line), line
    assert "divisible" not in line and "internal error" not in line, line


@pytest.mark.parametrize("text, what", [("5", "a number"), ("null", "null"), ('"gpt"', "a string"), ("[1, 2]", "an array")])
def test_a_config_json_that_is_not_an_object_is_one_line(text, what, tmp_path, probe_store, capsys):
    folder = checkpoint_folder(tmp_path, spec=None)
    (folder / "config.json").write_text(text)
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    assert code == 1
    line = cli_error_line(err)
    assert "config.json" in line and f"got {what}" in line, line


MODEL_OPTION = {
    "missing": (lambda f: None, "model spec not found"),
    "a FIFO": (lambda f: __import__("os").mkfifo(f), "not a regular file"),
    "not JSON": (lambda f: f.write_text("{nope"), "cannot read model spec"),
    "not an object": (lambda f: f.write_text("5"), "expected"),
    "a config value of the wrong type": (lambda f: f.write_text(json.dumps({"config": {**CONFIG.to_dict(), "n_embd": "abc"}})),
                                         "GPTConfig.n_embd"),
}  # fmt: skip


@pytest.mark.parametrize("what", list(MODEL_OPTION))
def test_a_bad_model_option_is_one_line_naming_the_file(what, tmp_path, probe_store, capsys):
    make, expected = MODEL_OPTION[what]
    spec = tmp_path / "spec.json"
    make(spec)
    folder = checkpoint_folder(tmp_path, spec=None)
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys, "--model", str(spec))
    line = cli_error_line(err)
    assert code == 1 and "spec.json" in line and expected in line, line


def test_an_unknown_hugging_face_model_type_is_a_short_line(tmp_path, probe_store, capsys):
    pytest.importorskip("transformers")
    folder = checkpoint_folder(tmp_path, spec={"type": "hf", "config": {"model_type": "nosuch"}})
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    line = cli_error_line(err)
    assert code == 1 and len(line) < 400, len(line)
    assert "tokdyn_model.json" in line and "'nosuch'" in line


@pytest.mark.parametrize(
    "entry, field",
    [({"path": 123}, "path"), ({"path": None}, "path"), ({"path": ["step_1.pt"]}, "path"), ({"path": ""}, "path"),
     ({"path": "step_1.pt", "kind": "pickle"}, "kind"),
     ({"path": "step_1.pt", "step": 2**63}, "step"), ({"path": "step_1.pt", "step": 10**40}, "step"),
     ({"path": "step_1.pt", "step": -1}, "step"), ({"path": "step_1.pt", "step": 1.5}, "step"),
     ({"path": "step_1.pt", "step": 1, "tokens_seen": 2**64}, "tokens_seen"),
     ({"path": "step_1.pt", "step": 1, "lr": "fast"}, "lr"), ({"path": "step_1.pt", "step": 1, "lr": float("inf")}, "lr"),
     pytest.param({"path": "step_1.pt", "step": 1, "lr": 10**400}, "lr", id="lr-int-past-1e308")],  # no float holds it
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else v,
)  # fmt: skip
def test_a_manifest_value_of_the_wrong_type_or_beyond_int64_names_the_field(entry, field, tmp_path, probe_store, capsys):
    folder = checkpoint_folder(tmp_path)
    (folder / "manifest.json").write_text(json.dumps({"checkpoints": [entry]}))
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    line = cli_error_line(err)
    assert code == 1 and "manifest.json entry 0" in line and field in line, line
    assert not (tmp_path / "o.zarr").exists()


def test_an_axis_value_that_is_not_finite_names_the_field(tmp_path, probe_store, capsys):
    folder = checkpoint_folder(tmp_path)
    (folder / "manifest.json").write_text('{"axis": "D", "checkpoints": [{"path": "step_1.pt", "axis_value": NaN}]}')
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    assert code == 1 and "axis_value must be a finite number" in cli_error_line(err)


@pytest.mark.parametrize("step", [INT64_MAX + 1, 10**30])
def test_a_step_in_a_file_name_beyond_int64_names_the_file(step, tmp_path, probe_store, capsys):
    folder = checkpoint_folder(tmp_path, name=f"step_{step}.pt")
    code, err = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    line = cli_error_line(err)
    assert code == 1 and f"step_{step}.pt" in line and "2**63 - 1" in line, line


def test_the_largest_int64_step_is_recorded(tmp_path, probe_store, capsys):
    folder = checkpoint_folder(tmp_path, name=f"step_{INT64_MAX}.pt")
    code, _ = record(folder, tmp_path / "o.zarr", probe_store, capsys)
    assert code == 0
    assert tokdyn.open_store(tmp_path / "o.zarr").run("r").steps.tolist() == [INT64_MAX]


# -- a probe the model's vocabulary does not cover -------------------------------------------


def _probe_reaching(vocab: int, *, where: str) -> ProbeSet:
    tokens = np.random.default_rng(0).integers(0, vocab, size=(8, CONFIG.context + 1))
    if where == "target":
        tokens[3, -1] = vocab  # only ever a target: the last position of one sequence
    else:
        tokens[3, 5] = vocab
    return ProbeSet.from_tokens(tokens)


@pytest.mark.parametrize("where", ["target", "input"])
def test_a_probe_token_beyond_the_vocabulary_names_the_checkpoint(where, tmp_path, capsys):
    probe_path = tmp_path / "p.zarr"
    tokdyn.open_store(probe_path, _probe_reaching(CONFIG.vocab_size, where=where), mode="w")
    folder = checkpoint_folder(tmp_path)
    code, err = record(folder, tmp_path / "o.zarr", probe_path, capsys)
    line = cli_error_line(err)
    assert code == 1 and "step_1.pt" in line and f"reach {CONFIG.vocab_size}" in line, line


class _Logits(torch.nn.Module):
    """A model that says nothing of its vocabulary: only its logits show it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = make_model(0)

    def forward(self, idx):
        return self.inner(idx.clamp(max=CONFIG.vocab_size - 1))


def test_logits_that_do_not_cover_a_target_are_an_error_naming_the_checkpoint(tmp_path):
    folder = checkpoint_folder(tmp_path)
    torch.save(_Logits().state_dict(), folder / "step_1.pt")
    with pytest.raises(InputError, match=r"step_1\.pt.*64 logits per position.*reach 64"):
        record_offline(folder, tmp_path / "o.zarr", "r", probe=_probe_reaching(CONFIG.vocab_size, where="target"),
                       model_factory=_Logits, workers=1, progress=False)  # fmt: skip


# -- tokdyn probe ----------------------------------------------------------------------------


def _probe_cli(source, out, capsys, *extra) -> tuple[int, str]:
    return run_cli(["probe", str(source), "--out", str(out), "--context", "4", "--sequences", "2", *extra], capsys)


def _jsonl(path, lines: list[bytes]):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


@pytest.mark.parametrize(
    "line",
    [b'{"text": "\xff bad bytes here"}', b'{"text": "a lone \\ud800 surrogate"}', b'{"text": "a lone low \\udc00 one"}',
     b'{"text": "cut \xe2\x82 short"}'],
    ids=["invalid byte", "lone high surrogate", "lone low surrogate", "cut multibyte"],
)  # fmt: skip
def test_jsonl_text_that_is_not_valid_unicode_is_replaced_as_in_text_files(line, tmp_path, capsys):
    src = _jsonl(tmp_path / "docs.jsonl", [line] * 40)
    code, err = _probe_cli(src, tmp_path / "p.zarr", capsys, "--probe-fraction", "0.9")
    assert code == 0, err
    tokens = tokdyn.open_store(tmp_path / "p.zarr").probe.tokens
    docs = jsonl_documents(src)
    assert all("\ufffd" in d.text for d in docs)
    assert tokens.max() < 257


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(points=hs.lists(hs.one_of(hs.integers(0xD800, 0xDFFF), hs.integers(0, 0x10FFFF)), min_size=1, max_size=40))  # surrogates often
def test_any_json_escaped_text_reads_and_tokenizes(points, tmp_path_factory):
    """Any code points written as JSON escapes (surrogates, alone or paired, included) read as
    valid text every tokenizer can encode."""
    escaped = "".join(f"\\u{p:04x}" if p < 0x10000 else chr(p) for p in points)
    path = tmp_path_factory.mktemp("jsonl") / "d.jsonl"
    path.write_text('{"text": "x' + escaped + '"}\n', encoding="utf-8")
    (doc,) = jsonl_documents(path)
    doc.text.encode("utf-8")  # valid Unicode
    ByteTokenizer().encode(doc.text)


def test_a_tokenizer_refuses_a_lone_surrogate_with_an_input_error():
    pytest.importorskip("tokenizers")
    bpe = HFTokenizer.train(["hello world"] * 5, vocab_size=300)
    for tok in (ByteTokenizer(), bpe):
        with pytest.raises(InputError, match=r"lone surrogate U\+D800 at character 2"):
            tok.encode("ab\ud800c")


@pytest.mark.parametrize(
    "content, extra, expected",
    [(b"", [], "empty token file"), (b"\x01", [], "not a multiple"),
     (b"\x01\x00" * 40, ["--bin-eot-id", "70000"], "end-of-text id"), (b"\x01\x00" * 40, ["--bin-eot-id", "-1"], "end-of-text id")],
    ids=["empty", "odd size", "eot beyond uint16", "negative eot"],
)  # fmt: skip
def test_a_bad_token_file_is_one_line_naming_it(content, extra, expected, tmp_path, capsys):
    (tmp_path / "t.bin").write_bytes(content)
    code, err = _probe_cli(tmp_path / "t.bin", tmp_path / "p.zarr", capsys, *extra)
    line = cli_error_line(err)
    assert code == 1 and "t.bin" in line and expected in line, line


@pytest.mark.parametrize(
    "option, value",
    [("--seed", "-1"), ("--context", "0"), ("--context", "-5"), ("--sequences", "0"), ("--probe-fraction", "1.5"),
     ("--probe-fraction", "nan")],
)  # fmt: skip
def test_the_probes_numbers_are_checked_before_any_work(option, value, tmp_path, capsys):
    """The source does not exist: the option's error comes first, before anything is read."""
    args = ["probe", str(tmp_path / "missing"), "--out", str(tmp_path / "p.zarr"), option, value]
    code, err = run_cli(args, capsys)
    line = cli_error_line(err)
    assert code == 1 and option in line and "internal error" not in line, line


@pytest.mark.parametrize("seed", [-1, -(2**70), 1.5, True])
def test_prepare_probe_checks_the_seed_before_reading(seed):
    from tokdyn.data import prepare_probe

    with pytest.raises(InputError, match="seed must be an integer >= 0"):
        prepare_probe("/nonexistent/corpus", seed=seed)


@pytest.fixture
def texts(tmp_path):
    root = tmp_path / "texts"
    root.mkdir()
    for i in range(20):
        (root / f"doc{i:02d}.txt").write_text(f"document {i} " * 20)
    return root


HELD_OUT = {
    "an existing folder": (lambda t, src: (t / "hodir").mkdir() or t / "hodir", "is a folder"),
    "in a missing folder": (lambda t, src: t / "nodir" / "held.txt", "does not exist"),
    "the --out store": (lambda t, src: t / "p.zarr", "--out store's path"),
    "the source itself": (lambda t, src: src / "doc00.txt", "part of the source"),
    "a new file in the source": (lambda t, src: src / "held.txt", "part of the source"),
}  # fmt: skip


@pytest.mark.parametrize("what", list(HELD_OUT))
def test_the_held_out_path_is_checked_before_any_work(what, texts, tmp_path, capsys):
    make, expected = HELD_OUT[what]
    held = make(tmp_path, texts)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, err = _probe_cli(texts, tmp_path / "p.zarr", capsys, "--held-out", str(held), "--probe-fraction", "0.5")
    line = cli_error_line(err)
    assert code == 1 and "--held-out" in line and expected in line, line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no store, no temporary file, nothing replaced


@pytest.mark.parametrize("kind", ["file", "folder of other files"])
def test_an_out_path_that_is_not_a_store_is_refused_before_any_work(kind, texts, tmp_path, capsys):
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / "mine.txt").write_text("mine")
    code, err = run_cli(["probe", str(tmp_path / "missing"), "--out", str(out)], capsys)
    line = cli_error_line(err)
    assert code == 1 and "--out" in line and ("not a store" in line or "no store" in line), line


def test_a_failed_probe_leaves_no_temporary_held_out_file(texts, tmp_path, capsys):
    """The probe cannot go into a store of another probe: the held-out keys are not written."""
    assert _probe_cli(texts, tmp_path / "p.zarr", capsys, "--probe-fraction", "0.5")[0] == 0
    held = tmp_path / "held.txt"
    code, err = _probe_cli(texts, tmp_path / "p.zarr", capsys, "--probe-fraction", "0.5", "--seed", "7", "--held-out", str(held))
    assert code == 1 and "fingerprint" in cli_error_line(err)
    assert not held.exists() and not list(tmp_path.glob(".held.txt.*"))
    code, _ = _probe_cli(texts, tmp_path / "q.zarr", capsys, "--probe-fraction", "0.5", "--held-out", str(held))
    assert code == 0 and held.read_text().split() and not list(tmp_path.glob(".held.txt.*"))


@pytest.mark.parametrize("device", ["bogus", "meta", "cuda:99", "fpga"])
def test_every_command_gets_the_same_device_check(device):
    """resolve_device (demo, train, the curriculum, record-offline) refuses a device that cannot
    hold data on this machine, in one InputError; cpu passes."""
    import torch

    from tokdyn.errors import InputError
    from tokdyn.runtime import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    if device == "cuda:99" and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    with pytest.raises(InputError, match="device|torch device"):
        resolve_device(device)
