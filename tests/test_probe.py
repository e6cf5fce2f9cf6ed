"""Corpus sources, the document split, tokenizers, probe construction and schedules."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tokdyn
from tokdyn.corpus import Document
from tokdyn.data import prepare_corpus, random_batches, training_stream
from tokdyn.errors import InputError


# -- corpus --------------------------------------------------------------------------------


def test_stdlib_documents_are_real_source_with_domains():
    docs = tokdyn.stdlib_documents()
    keys = [d.key for d in docs]
    assert len(docs) > 100 and keys == sorted(keys) and len(set(keys)) == len(keys)
    by_key = {d.key: d for d in docs}
    assert by_key["json/decoder.py"].domain == "json"
    assert by_key["os.py"].domain == "os"
    assert "def " in by_key["os.py"].text
    assert not any(k.startswith("test/") or "site-packages" in k for k in keys)


def test_text_and_jsonl_sources(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("hello")
    (tmp_path / "y.txt").write_text("world")
    (tmp_path / "empty.txt").write_text("")
    docs = tokdyn.text_documents(tmp_path)
    assert [(d.key, d.domain, d.text) for d in docs] == [("a/x.txt", "a", "hello"), ("y.txt", "y", "world")]
    j = tmp_path / "d.jsonl"
    j.write_text(json.dumps({"text": "one", "src": "w"}) + "\n\n" + json.dumps({"text": "two", "src": "b"}) + "\n")
    docs = tokdyn.jsonl_documents(j, domain_field="src")
    assert [(d.text, d.domain) for d in docs] == [("one", "w"), ("two", "b")]
    j.write_text('{"text": 1}\n')
    with pytest.raises(InputError, match=":1: the text field 'text' must be a string; it is 1 \\(a number\\)"):
        tokdyn.jsonl_documents(j)
    j.write_text("{not json\n")
    with pytest.raises(InputError, match="not valid JSON"):
        tokdyn.jsonl_documents(j)
    with pytest.raises(InputError, match="not found"):
        tokdyn.text_documents(tmp_path / "missing")


def test_bin_documents(tmp_path):
    arr = np.array([5, 6, 0, 7, 8, 9, 0, 1, 2], dtype=np.uint16)
    p = tmp_path / "t.bin"
    arr.tofile(p)
    docs = tokdyn.bin_documents(p, eot_id=0)
    assert [d.tokens.tolist() for d in docs] == [[5, 6, 0], [7, 8, 9, 0], [1, 2]]
    docs = tokdyn.bin_documents(p, doc_tokens=4)
    assert [d.tokens.tolist() for d in docs] == [[5, 6, 0, 7], [8, 9, 0, 1]]  # a 1-token tail is dropped
    (tmp_path / "odd.bin").write_bytes(b"\x00\x01\x02")
    with pytest.raises(InputError, match="not a multiple"):
        tokdyn.bin_documents(tmp_path / "odd.bin")


def test_split_is_deterministic_disjoint_and_keyed():
    docs = [Document(key=f"d{i}", domain="x", text="t") for i in range(400)]
    train, probe = tokdyn.split_documents(docs, probe_fraction=0.1)
    train2, probe2 = tokdyn.split_documents(list(reversed(docs)), probe_fraction=0.1)
    assert {d.key for d in probe} == {d.key for d in probe2}  # order of the corpus does not matter
    assert not {d.key for d in train} & {d.key for d in probe}
    assert len(train) + len(probe) == 400
    assert 20 <= len(probe) <= 60  # ~10 % of 400
    # A document's side depends on its key only: a sub-corpus splits the same way.
    sub_train, sub_probe = tokdyn.split_documents(docs[:200], probe_fraction=0.1)
    assert {d.key for d in sub_probe} == {d.key for d in probe if int(d.key[1:]) < 200}
    with pytest.raises(InputError, match="unique"):
        tokdyn.split_documents(docs + docs[:1])
    with pytest.raises(InputError, match="probe_fraction"):
        tokdyn.split_documents(docs, probe_fraction=1.5)


# -- tokenizers ----------------------------------------------------------------------------


def test_byte_tokenizer_roundtrip():
    tok = tokdyn.ByteTokenizer()
    ids = tok.encode("héllo")
    assert ids.tolist() == list("héllo".encode())
    assert tok.decode(ids) == "héllo"
    assert tok.spec() == {"kind": "byte", "vocab_size": 257, "eot_id": 256}


def test_hf_tokenizer_train_save_load(tmp_path):
    pytest.importorskip("tokenizers")
    texts = [d.text for d in tokdyn.stdlib_documents()[:40]]
    tok = tokdyn.HFTokenizer.train(texts, vocab_size=400)
    assert tok.vocab_size <= 400
    ids = tok.encode("def foo(self):\n    return 1\n")
    assert tok.decode(ids) == "def foo(self):\n    return 1\n"
    tok.save(tmp_path / "tokenizer.json")
    again = tokdyn.get_tokenizer("hf", path=tmp_path)
    assert again.spec() == tok.spec()
    np.testing.assert_array_equal(again.encode("import os"), tok.encode("import os"))
    with pytest.raises(InputError, match="not found"):
        tokdyn.HFTokenizer.from_file(tmp_path / "nope.json")
    with pytest.raises(InputError, match="unknown tokenizer"):
        tokdyn.get_tokenizer("sentencepiece")


# -- probe ---------------------------------------------------------------------------------


def test_probe_layout_matches_definition():
    tokens = np.arange(2 * 5).reshape(2, 5)  # S=2, C=4
    p = tokdyn.ProbeSet.from_tokens(tokens, doc_id=np.array([0, 1]), doc_offset=np.array([0, 10]),
                                    domain=np.array([1, 0]), domains=("a", "b"), documents=("x", "y"))  # fmt: skip
    a = p.token_arrays
    assert p.n_tokens == 8 and p.context == 4 and p.n_sequences == 2
    assert a["sample_id"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert a["token_pos"].tolist() == [1, 2, 3, 4] * 2  # position 0 has no context: excluded
    assert a["token_id"].tolist() == [1, 2, 3, 4, 6, 7, 8, 9]  # the targets
    assert a["doc_pos"].tolist() == [1, 2, 3, 4, 11, 12, 13, 14]
    assert a["domain"].tolist() == [1] * 4 + [0] * 4
    assert p.sequence_range(4, 8) == (1, 2)
    with pytest.raises(InputError, match="aligned"):
        p.sequence_range(2, 8)


def test_probe_fingerprint_tracks_content():
    rng = np.random.default_rng(0)
    t = rng.integers(0, 257, (4, 9))
    a = tokdyn.ProbeSet.from_tokens(t)
    assert a.fingerprint == tokdyn.ProbeSet.from_tokens(t.copy()).fingerprint
    t2 = t.copy()
    t2[2, 3] += 1
    assert a.fingerprint != tokdyn.ProbeSet.from_tokens(t2).fingerprint
    assert a.fingerprint != tokdyn.ProbeSet.from_tokens(t, domains=("other",)).fingerprint


def test_build_probe_from_documents():
    docs = tokdyn.stdlib_documents()[:30]
    tok = tokdyn.ByteTokenizer()
    p = tokdyn.build_probe(docs, tok, context=32, n_sequences=20, seed=1)
    assert p.tokens.shape == (20, 33)
    # Every window is real text from the document it claims, at the offset it claims.
    for s in range(20):
        i = s * 32
        doc = next(d for d in docs if d.key == p.documents[p.token_arrays["doc_id"][i]])
        off = int(p.token_arrays["doc_pos"][i]) - 1
        np.testing.assert_array_equal(p.tokens[s], tok.encode(doc.text)[off : off + 33])
        assert p.domains[p.token_arrays["domain"][i]] == doc.domain
    assert tokdyn.build_probe(docs, tok, context=32, n_sequences=20, seed=1).fingerprint == p.fingerprint
    assert tokdyn.build_probe(docs, tok, context=32, n_sequences=20, seed=2).fingerprint != p.fingerprint
    with pytest.raises(InputError, match="windows"):
        tokdyn.build_probe(docs[:1], tok, context=4096, n_sequences=50)


def test_probe_validation():
    with pytest.raises(InputError, match="sample_id"):
        tokdyn.ProbeSet(None, {"token_pos": np.zeros(3)})
    with pytest.raises(InputError, match="shape"):
        tokdyn.ProbeSet(None, {"sample_id": np.zeros(3), "token_pos": np.zeros(2)})
    with pytest.raises(InputError, match="targets"):
        tokdyn.ProbeSet(np.zeros((2, 5), int), {"sample_id": np.zeros(3), "token_pos": np.zeros(3)})


def test_prepare_corpus_keeps_probe_text_out_of_training():
    c = prepare_corpus(context=64, n_probe_sequences=16)
    assert c.probe.tokens.shape == (16, 65)
    stream = c.train_tokens.astype(np.int64)
    # No probe window of 65 bytes occurs in the training stream (it comes from held-out files).
    hay = stream.astype(np.uint16).tobytes()
    hits = sum(hay.find(w.astype(np.uint16).tobytes()) >= 0 for w in c.probe.tokens[:4])
    assert hits == 0


def test_training_stream_and_batches():
    tok = tokdyn.ByteTokenizer()
    s = training_stream([Document("a", "x", text="ab"), Document("b", "x", text="c")], tok)
    assert s.tolist() == [97, 98, 256, 99, 256]
    b = next(random_batches(np.arange(100, dtype=np.int32), batch_size=3, context=4, seed=0))
    assert b.shape == (3, 5)
    assert (b[:, 1:] - b[:, :-1] == 1).all()  # contiguous windows
    with pytest.raises(InputError, match="shorter"):
        next(random_batches(np.arange(3, dtype=np.int32), batch_size=1, context=4))


# -- schedules -----------------------------------------------------------------------------


def test_geometric_schedule():
    s = tokdyn.geometric_schedule(1000, 20)
    assert s[0] == 0 and s[-1] == 1000 and np.all(np.diff(s) > 0)
    logs = np.log10(s[s >= 10])
    assert np.ptp(np.diff(logs)) < 0.05  # even in log step once rounding no longer merges steps
    assert tokdyn.geometric_schedule(100, 5, first=3)[0] == 3


def test_pythia_schedule():
    s = tokdyn.pythia_schedule(5000, every=1000)
    assert s.tolist() == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 3000, 4000, 5000]
    assert tokdyn.pythia_schedule(2500, every=1000)[-1] == 2500  # the last step is always kept


def test_explicit_schedule_and_errors():
    assert tokdyn.explicit_schedule([5, 1, 3]).tolist() == [1, 3, 5]
    with pytest.raises(InputError, match="duplicate"):
        tokdyn.explicit_schedule([1, 1])
    with pytest.raises(InputError, match=">= 0"):
        tokdyn.explicit_schedule([-1, 2])
    with pytest.raises(InputError, match="integers"):
        tokdyn.explicit_schedule([1.5])
    with pytest.raises(InputError, match="first <= last"):
        tokdyn.geometric_schedule(5, 10, first=8)
    with pytest.raises(InputError, match="unknown schedule"):
        tokdyn.make_schedule("cosine", 10)


@pytest.mark.parametrize("line, found", [('{"text": null}', "it is null"), ('{"text": 5}', "it is 5 (a number)"),
                                         ('{"text": true}', "it is true (a boolean)"), ('{"text": ["a"]}', 'it is ["a"] (a list)'),
                                         ('{"text": {"a": 1}}', 'it is {"a": 1} (an object)'), ('{"body": "x"}', "it has no such field"),
                                         ('[1, 2]', "the line is [1, 2] (a list)"), ('"abc"', 'the line is "abc" (a string)')])  # fmt: skip
def test_a_jsonl_record_without_string_text_is_named_with_what_it_holds(tmp_path, line, found):
    # the text field's errors named the line only (the domain field's named the value too)
    j = tmp_path / "d.jsonl"
    j.write_text(json.dumps({"text": "one"}) + "\n" + line + "\n")
    with pytest.raises(InputError) as ex:
        tokdyn.jsonl_documents(j)
    assert str(ex.value).startswith(f"{j}:2: ") and str(ex.value).endswith(found), str(ex.value)
