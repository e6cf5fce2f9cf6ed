"""`tokdyn probe` and a user's own tokenizer: a probe store from a folder of text, split by
document, then the whole CLI path on it (record-offline, fit, report)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tokdyn
from reliability_fixtures import cli_error_line
from tokdyn.cli import main
from tokdyn.corpus import split_documents, text_documents
from tokdyn.model import GPTConfig, TinyGPT

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture
def texts(tmp_path):
    root = tmp_path / "texts"
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "loss", "token", "step", "model", "(", ")", ":", "def", "return"]
    for domain in ("prose", "code"):
        (root / domain).mkdir(parents=True)
        for i in range(30):
            (root / domain / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(words, 400)) + "\n")
    return root


def test_probe_from_a_text_folder_holds_out_whole_documents(texts, tmp_path, capsys):
    out, held = tmp_path / "p.zarr", tmp_path / "held.txt"
    assert main(["probe", str(texts), "--out", str(out), "--context", "32", "--sequences", "24", "--probe-fraction", "0.2",
                 "--held-out", str(held)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    probe = tokdyn.open_store(out).probe
    assert probe.fingerprint in printed and probe.n_tokens == 24 * 32
    assert sorted(probe.domains) == ["code", "prose"]
    train, held_docs = split_documents(text_documents(texts), probe_fraction=0.2)  # the split, reproduced independently
    assert held.read_text().split() == [d.key for d in held_docs]
    assert set(probe.documents) <= {d.key for d in held_docs} and not set(probe.documents) & {d.key for d in train}
    again = main(["probe", str(texts), "--out", str(out), "--context", "32", "--sequences", "24", "--probe-fraction", "0.2"])
    assert again == 0  # the same probe into the same store: accepted
    assert main(["probe", str(texts), "--out", str(out), "--context", "16", "--sequences", "24", "--probe-fraction", "0.2"]) == 1
    assert "fingerprint" in cli_error_line(capsys.readouterr().err)


def _bpe(path, texts, *, specials):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tok.train_from_iterator([p.read_text() for p in sorted(texts.rglob("*.txt"))], trainer=trainer)
    tok.save(str(path))
    return tok


def test_a_users_tokenizer_is_taken_as_it_is(texts, tmp_path, capsys):
    own = _bpe(tmp_path / "tokenizer.json", texts, specials=["[EOS]"])
    t = tokdyn.HFTokenizer.from_file(tmp_path / "tokenizer.json")
    assert t.eot_id is None and t.vocab_size == own.get_vocab_size(with_added_tokens=True)  # nothing added
    assert tokdyn.HFTokenizer.from_file(tmp_path, eot="[EOS]").eot_id == own.token_to_id("[EOS]")  # a folder holding it
    with pytest.raises(tokdyn.InputError, match="no token '</s>'"):
        tokdyn.HFTokenizer.from_file(tmp_path / "tokenizer.json", eot="</s>")
    out = tmp_path / "p.zarr"
    assert main(["probe", str(texts), "--out", str(out), "--tokenizer", str(tmp_path / "tokenizer.json"), "--eot", "[EOS]",
                 "--context", "16", "--sequences", "8", "--probe-fraction", "0.2"]) == 0  # fmt: skip
    spec = tokdyn.open_store(out).probe.tokenizer
    assert spec["kind"] == "hf" and spec["eot"] == "[EOS]" and spec["vocab_size"] == own.get_vocab_size(with_added_tokens=True)
    from tokdyn.data import training_stream

    docs = text_documents(texts)[:2]
    joined = training_stream(docs, t)  # no end-of-text token: documents joined as they are
    assert joined.size == sum(len(t.encode(d.text)) for d in docs)


def test_own_text_to_report_with_the_command_line_only(texts, tmp_path, capsys):
    """The path docs/recording.md gives a newcomer with a folder of text and checkpoints: probe,
    record-offline, fit, report; every step through the CLI."""
    store = tmp_path / "p.zarr"
    assert main(["probe", str(texts), "--out", str(store), "--context", "16", "--sequences", "8", "--probe-fraction", "0.2"]) == 0
    cfg = GPTConfig(vocab_size=257, context=16, n_layer=1, n_head=2, n_embd=16)
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    (ckpts / "tokdyn_model.json").write_text(json.dumps({"type": "tinygpt", "config": cfg.to_dict()}))
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    probe = tokdyn.open_store(store).probe
    data = torch.as_tensor(probe.tokens, dtype=torch.long)  # a toy: train on the probe's own windows
    for step in range(1, 65):
        logits = model(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in (1, 2, 4, 8, 16, 32, 64):
            torch.save(model.state_dict(), ckpts / f"step{step}.pt")
    assert main(["record-offline", "--checkpoints", str(ckpts), "--out", str(store), "--run", "own", "--no-progress"]) == 0
    assert main(["fit", str(store), "--no-progress"]) == 0
    assert main(["report", str(store), "--out", str(tmp_path / "report.html")]) == 0
    assert (tmp_path / "report.html").read_text().startswith("<!doctype html>")
