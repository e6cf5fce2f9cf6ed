"""Defect hunt 11: probe preparation and learnability tables.

1. ``ProbeSet.from_tokens`` cast token ids and the per-sequence arrays to int32/int64 before
   checking them: an id of 2**31 (a tokenizer vocabulary of 2**31 or more) wrapped and was
   refused as "negative values", a ``domain`` of 2**32 wrapped to 0 and silently joined the first
   domain, ``doc_id`` 2**31 or -1 and a ``doc_offset`` past 2**63 were stored wrapped, fractions
   were cut (1.5 -> 1), and ``domains="default"`` became the domains ``d, e, f, a, u, l, t``.
   Now every value is checked before its cast, with one line naming the limit (int32 probe ids).
2. ``tokenstats.position_bands`` cast positions with ``np.asarray(pos, np.int64)``: 3.9 went into
   band "2-3", NaN became -2**63 (with a RuntimeWarning, then "positions >= 0"), a string "8" was
   a position, and ``2**62 - 1`` fell into the band above through float64's log2.
3. ``load_table`` took hand-edited tables whose keys no lookup produces (outside
   ``[0, (V+1)**k)``, or a target id of V), negative counts, ``n_events`` above ``count``,
   uint64 keys that wrapped (reported as "unsorted"), arrays of another order, and a tokenizer
   spec that disagrees with ``vocab_size``.
Hunt: an HF tokenizer of fewer than 2 tokens, or one that cannot encode (a WordLevel vocabulary
without its unknown token), was an internal error after the corpus was read; a tokenizer whose
``encode`` gives floats had them cut to ids.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

import tokdyn
from reliability_fixtures import cli_error_line
from tokdyn.cli import main
from tokdyn.corpus import Document
from tokdyn.curriculum.learnability import LearnabilityOptions, LearnabilityTable, load_table
from tokdyn.errors import InputError
from tokdyn.probe import ProbeSet, build_probe
from tokdyn.tokenizer import ByteTokenizer
from tokdyn.tokenstats import position_bands

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BASE = np.array([[1, 2, 3], [4, 5, 6]])  # two sequences of context 2


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


# -- 1. probe ids and per-sequence arrays: checked before any cast --------------------------


@pytest.mark.parametrize("vocab", [None, 2**32])
def test_a_token_id_past_int32_is_refused_naming_the_limit_not_as_negative(vocab):
    spec = {} if vocab is None else {"kind": "hf", "vocab_size": vocab}
    with pytest.raises(InputError) as exc:
        ProbeSet.from_tokens(np.array([[1, 2**31 + 5, 3], [4, 5, 6]]), tokenizer=spec)
    msg = _one_line(exc)
    assert "negative" not in msg and "int32" in msg and "2147483653" in msg and "[0, 2147483648)" in msg


def test_a_vocabulary_past_int32_is_usable_while_the_probe_ids_fit():
    """What the learnability table allows at orders 1-2: the spec says 2**32, the ids are small."""
    p = ProbeSet.from_tokens(BASE, tokenizer={"kind": "hf", "vocab_size": 2**32})
    assert p.tokens.dtype == np.int32 and p.tokenizer["vocab_size"] == 2**32
    assert p.token_arrays["token_id"].tolist() == [2, 3, 5, 6]


@FAST
@given(field=st.sampled_from(["doc_id", "domain"]),
       value=st.one_of(st.integers(-(2**40), 2**40), st.integers(2**31 - 3, 2**31 + 3), st.integers(-3, 3)))  # fmt: skip
def test_per_sequence_ids_are_stored_exactly_or_refused(field, value):
    """doc_id and domain (int32 in the store): a value is either kept exactly or refused, never wrapped."""
    names = {"domains": [f"d{i}" for i in range(max(1, min(value + 1, 64)))]} if field == "domain" and 0 <= value < 64 else {}
    if field == "domain" and not names:
        names = {"domains": ()}  # no names: the domain index itself must still not wrap
    arg = np.array([0, value], dtype=np.int64)
    try:
        p = ProbeSet.from_tokens(BASE, **{field: arg}, **names)
    except InputError as exc:
        assert "\n" not in str(exc)
        assert not 0 <= value < 2**31, str(exc)
        return
    assert 0 <= value < 2**31
    assert p.token_arrays[field].tolist() == [0, 0, value, value]


@FAST
@given(offset=st.one_of(st.integers(-(2**63), 2**64 - 1), st.integers(2**63 - 6, 2**63 + 2), st.integers(-3, 1000)))
def test_doc_positions_are_exact_or_refused(offset):
    """doc_pos = doc_offset + p (int64): exact, or refused when negative or past 2**63."""
    dtype = np.uint64 if offset >= 2**63 else np.int64
    try:
        p = ProbeSet.from_tokens(BASE, doc_offset=np.array([0, offset], dtype=dtype))
    except InputError as exc:
        assert "\n" not in str(exc)
        assert offset < 0 or offset + 2 >= 2**63, str(exc)
        return
    assert p.token_arrays["doc_pos"].tolist() == [1, 2, offset + 1, offset + 2]


@pytest.mark.parametrize("field,value,says", [
    ("doc_id", [0, 1.5], "1.5"), ("domain", [0, 0.7], "0.7"), ("doc_offset", [0, float("nan")], "nan"),
    ("doc_id", [False, True], "booleans"), ("doc_id", ["0", "1"], "strings"), ("domain", [0, 2**32], "4294967296"),
    ("doc_id", [0, -1], "negative"),
])  # fmt: skip
def test_fractions_booleans_strings_and_wrapping_values_are_refused(field, value, says):
    names = {"domains": ("a", "b")} if field == "domain" else {}
    with pytest.raises(InputError) as exc:
        ProbeSet.from_tokens(BASE, **{field: np.array(value)}, **names)
    msg = _one_line(exc)
    assert field in msg and says in msg


def test_whole_number_floats_are_taken_as_the_numbers_they_hold():
    p = ProbeSet.from_tokens(BASE, doc_id=np.array([0.0, 7.0]), doc_offset=np.array([10.0, 20.0]),
                             domain=np.array([1.0, 0.0]), domains=("a", "b"))  # fmt: skip
    assert p.token_arrays["doc_id"].tolist() == [0, 0, 7, 7]
    assert p.token_arrays["doc_pos"].tolist() == [11, 12, 21, 22]
    assert p.token_arrays["domain"].tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize("field", ["domains", "documents"])
def test_a_single_string_of_names_is_refused_not_split_into_letters(field):
    with pytest.raises(InputError, match=f"{field} must be a sequence of names.*'default'"):
        ProbeSet.from_tokens(BASE, **{field: "default"})


def test_ragged_tokens_are_one_input_error():
    with pytest.raises(InputError, match="probe tokens must be an array"):
        ProbeSet.from_tokens([[1, 2, 3], [4, 5]])


def test_per_token_arrays_that_contradict_the_tokens_are_refused():
    good = ProbeSet.from_tokens(BASE)
    for name in ("token_id", "token_pos", "sample_id"):
        arrays = dict(good.token_arrays)
        arrays[name] = arrays[name][::-1].copy()
        with pytest.raises(InputError, match=f"probe array '{name}' does not match the probe tokens"):
            ProbeSet(good.tokens, arrays)


def test_probes_keep_the_fingerprint_the_code_before_gave():
    """Same inputs, same stored dtypes and bytes: the fingerprint the code before this hunt gave
    (computed with it), so every store written before opens with the probe made now."""
    rng = np.random.default_rng(0)
    tok = rng.integers(0, 257, size=(6, 9))
    p = ProbeSet.from_tokens(tok, doc_id=np.arange(6), doc_offset=np.arange(6) * 9, domain=np.array([0, 0, 1, 1, 0, 1]),
                             domains=("a", "b"), documents=tuple(f"d{i}" for i in range(6)),
                             tokenizer={"kind": "byte", "vocab_size": 257, "eot_id": 256})  # fmt: skip
    assert p.fingerprint == "27b4c3281721cb4fdbbc997ebdd63ed6"
    assert {k: v.dtype.str for k, v in p.token_arrays.items()} == {
        "sample_id": "<i4", "token_pos": "<i4", "token_id": "<i4", "doc_id": "<i4", "doc_pos": "<i8", "domain": "<i4"}


class _Custom(ByteTokenizer):
    def __init__(self, encode, vocab_size=257):
        self._encode, self.vocab_size = encode, vocab_size

    def encode(self, text):
        return self._encode(text)

    def spec(self):
        return {"kind": "custom", "vocab_size": self.vocab_size}


_DOCS = [Document(key=f"k{i}", domain="d", text="abcdefgh" * 4) for i in range(3)]


def test_build_probe_names_int32_for_ids_inside_a_huge_vocabulary():
    """It said "outside [0, 2147483648) of the tokenizer's vocabulary (4294967296)": the ids were inside it."""
    tok = _Custom(lambda t: np.full(len(t), 2**31 + 1, np.int64), vocab_size=2**32)
    with pytest.raises(InputError) as exc:
        build_probe(_DOCS, tok, context=4, n_sequences=2)
    msg = _one_line(exc)
    assert "int32" in msg and "2147483649" in msg and "vocabulary" not in msg


def test_build_probe_refuses_float_ids_rather_than_cutting_them():
    tok = _Custom(lambda t: np.frombuffer(t.encode(), np.uint8) + 0.7)
    with pytest.raises(InputError, match="float64 values, not integer token ids"):
        build_probe(_DOCS, tok, context=4, n_sequences=2)


# -- 2. position bands ------------------------------------------------------------------------


@FAST
@given(pos=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=20),
       dtype=st.sampled_from(["int64", "uint64", "float64"]))  # fmt: skip
@example(pos=[2**62 - 1, 2**62], dtype="int64")  # float64's log2 put 2**62 - 1 into the band of 2**62
def test_position_bands_are_floor_log2_exactly(pos, dtype):
    if dtype == "float64":
        pos = [p for p in pos if p < 2**53] or [1]  # whole floats a float64 holds exactly
    band, labels = position_bands(np.array(pos, dtype=dtype), None)
    want = [max(p, 1).bit_length() - 1 for p in pos]  # independent: Python's exact integers
    assert band.tolist() == want
    assert len(labels) == max(max(pos), 1).bit_length()


@pytest.mark.parametrize("pos,says", [
    ([1.0, 2.5, 3.0], "2.5"), ([1.0, float("nan")], "nan"), ([1.0, float("inf")], "inf"), ([1.0, 1e30], "1e+30"),
    ([True, False], "bool"), (["1", "8"], "<U1"), ([1.0, -2.0], "-2.0"),
])  # fmt: skip
def test_position_bands_refuse_what_is_not_a_whole_position(pos, says):
    with pytest.raises(InputError) as exc:
        position_bands(np.array(pos), 8)
    assert says in _one_line(exc)


@pytest.mark.parametrize("context", [4.7, float("nan"), -5, 0, "8", True])
def test_position_bands_refuse_a_context_that_is_not_a_count(context):
    with pytest.raises(InputError, match="context must be None or an integer >= 1"):
        position_bands(np.array([1, 2, 3]), context)


# -- 3. learnability tables -------------------------------------------------------------------

V = 12


@pytest.fixture(scope="module")
def saved_table(tmp_path_factory):
    rng = np.random.default_rng(3)
    tok = rng.integers(0, V, size=(40, 7))
    n = 40 * 6
    targets = {"delta": rng.random(n), "mu": rng.random(n) * 3, "weight": rng.random(n)}
    table = LearnabilityTable.fit(tok, targets, vocab_size=V, options=LearnabilityOptions(order=2, min_count=1, holdout=0),
                                  meta={"tokenizer": {"kind": "custom", "vocab_size": V}})  # fmt: skip
    path = tmp_path_factory.mktemp("t") / "table.npz"
    table.save(path)
    return path, tok, table


def _edited(path, tmp_path, edit=None, edit_meta=None):
    data = dict(np.load(path))
    meta = json.loads(bytes(data["meta"]).decode())
    if edit:
        edit(data)
    if edit_meta:
        edit_meta(meta)
    data["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    out = tmp_path / "edited.npz"
    np.savez(out, **data)
    return out


def _append(k, key):
    def edit(d):
        for f in ("keys", "mu", "delta", "count", "n_events"):
            d[f"{f}_{k}"] = np.append(d[f"{f}_{k}"], key if f == "keys" else d[f"{f}_{k}"][-1])
    return edit


def _set(name, i, value, dtype=None):
    def edit(d):
        a = d[name].astype(dtype) if dtype else d[name].copy()
        a[i] = value
        d[name] = a
    return edit


B = V + 1
EDITS = {
    "target id V (the no-token id)": (_append(1, V), None, "target id 12"),
    "order-1 key past (V+1)": (_append(1, V + 5), None, "outside [0, 13)"),
    "order-2 key past (V+1)**2": (_append(2, B**2 + 3), None, "outside [0, 169)"),
    "order-2 key with previous token V": (_append(2, 1 + B * V), None, "previous token id 12"),
    "negative key": (_set("keys_1", 0, -3), None, "key -3"),
    "uint64 key past int64": (_set("keys_2", -1, 2**64 - 1, np.uint64), None, "beyond int64"),
    "negative count": (_set("count_1", 0, -4), None, "'count' must be >= 1"),
    "zero count": (_set("count_2", 1, 0), None, "'count' must be >= 1"),
    "n_events above count": (lambda d: d.__setitem__("n_events_1", d["count_1"] + 1), None, "'n_events' must lie in [0, count]"),
    "negative n_events": (_set("n_events_2", 0, -1), None, "'n_events' must lie in [0, count]"),
    "NaN mu": (_set("mu_1", 0, np.nan), None, "nan"),
    "mu past float32": (_set("mu_2", 0, 1e300, np.float64), None, "1e+300"),
    "arrays of order 3 in an order-2 table": (lambda d: [d.__setitem__(f"{f}_3", d[f"{f}_2"]) for f in ("keys", "mu", "delta", "count", "n_events")],
                                              None, "keys_3"),
    "tokenizer spec of another vocabulary": (None, lambda m: m.__setitem__("tokenizer", {"kind": "custom", "vocab_size": 50000}), "50000"),
    "vocab_size smaller than the ids keyed": (None, lambda m: m.__setitem__("vocab_size", 5) or m.__setitem__("tokenizer", {}), "outside"),
    "unsorted keys": (lambda d: d.__setitem__("keys_1", d["keys_1"][::-1].copy()), None, "sorted and unique"),
    "lengths differ": (lambda d: d.__setitem__("delta_2", d["delta_2"][:-1]), None, "length"),
}


@pytest.mark.parametrize("what", list(EDITS))
def test_a_hand_edited_table_is_refused_in_one_line_naming_the_file(saved_table, tmp_path, what):
    edit, edit_meta, says = EDITS[what]
    path = _edited(saved_table[0], tmp_path, edit, edit_meta)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning from a cast (overflow) is part of what was wrong
        with pytest.raises(InputError) as exc:
            load_table(path)
    msg = _one_line(exc)
    assert str(path) in msg and "is not a learnability table" in msg and says in msg, msg


def test_a_table_written_by_save_loads_and_answers_as_before(saved_table, tmp_path):
    path, tok, table = saved_table
    back = load_table(path)
    want, got = table.predict(tok), back.predict(tok)
    for k in ("mu", "delta", "level"):
        assert np.array_equal(want[k], got[k])
    assert back.n_keys == table.n_keys


@FAST
@given(t0=st.integers(0, V), t1=st.integers(0, V))  # every digit a key of base V + 1 holds
def test_every_order_two_key_a_table_accepts_is_one_a_lookup_reaches(t0, t1):
    """Independent of the check's own arithmetic: a key is accepted iff it is target t0 after
    token t1, both real ids; then the lookup of the window (t1, t0) answers from it."""
    key = t0 + B * t1
    lev1 = {"keys": torch.tensor([0]), "mu": torch.tensor([0.0]), "delta": torch.tensor([0.0]),
            "count": torch.tensor([1]), "n_events": torch.tensor([0])}  # fmt: skip
    lev2 = {"keys": torch.tensor([key]), "mu": torch.tensor([7.0]), "delta": torch.tensor([3.0]),
            "count": torch.tensor([2]), "n_events": torch.tensor([1])}  # fmt: skip
    try:
        table = LearnabilityTable(vocab_size=V, levels=[lev1, lev2], mu_global=1.0, delta_global=0.5)
    except InputError:
        assert not (t0 < V and t1 < V)
        return
    assert t0 < V and t1 < V
    mu, delta, level = table.lookup(torch.tensor([[t1, t0]]))
    assert level.tolist() == [[2]] and mu.tolist() == [[7.0]] and delta.tolist() == [[3.0]]


# -- hunt: user tokenizers -------------------------------------------------------------------

tokenizers = pytest.importorskip("tokenizers")


def _wordlevel(path, vocab, unk="[UNK]"):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


@pytest.fixture
def texts(tmp_path):
    for i in range(24):
        folder = tmp_path / "texts" / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"doc{i}.txt").write_text("hello world foo bar " * 20, encoding="utf-8")
    return tmp_path / "texts"


@pytest.mark.parametrize("vocab,says", [
    ({"[UNK]": 0}, "vocabulary of 1 token(s)"),
    ({}, "vocabulary of 0 token(s)"),
    ({"hello": 0, "world": 1}, "cannot encode the text: WordLevel error: Missing [UNK]"),
])  # fmt: skip
def test_tokdyn_probe_with_an_unusable_tokenizer_is_one_error_line(tmp_path, texts, capsys, vocab, says):
    tok = _wordlevel(tmp_path / "tok.json", vocab)
    code = main(["probe", str(texts), "--out", str(tmp_path / "s.zarr"), "--tokenizer", str(tok), "--context", "8",
                 "--sequences", "4", "--probe-fraction", "0.3"])  # fmt: skip
    assert code == 1
    line = cli_error_line(capsys.readouterr().err)
    assert says in line and "internal error" not in line, line
    assert not (tmp_path / "s.zarr").exists()


def test_a_tokenizer_with_gaps_in_its_ids_makes_a_probe(tmp_path, texts, capsys):
    """vocab_size is one past the largest id (7), not the count of tokens (5)."""
    tok = _wordlevel(tmp_path / "tok.json", {"[UNK]": 0, "hello": 1, "world": 2, "foo": 5, "bar": 7})
    assert main(["probe", str(texts), "--out", str(tmp_path / "s.zarr"), "--tokenizer", str(tok), "--context", "8",
                 "--sequences", "4", "--probe-fraction", "0.3"]) == 0  # fmt: skip
    probe = tokdyn.open_store(tmp_path / "s.zarr").probe
    assert probe.tokenizer["vocab_size"] == 8 and set(np.unique(probe.tokens)) <= {1, 2, 5, 7}
    assert probe.n_tokens == 32


def test_tokdyn_probe_loads_the_tokenizer_before_reading_the_corpus(tmp_path, texts, capsys, monkeypatch):
    """A mistyped --tokenizer path was found only after every document was read (minutes on a corpus)."""
    import tokdyn.data

    read = []
    monkeypatch.setattr(tokdyn.data, "prepare_probe", lambda *a, **k: read.append(a) or pytest.fail("corpus read first"))
    code = main(["probe", str(texts), "--out", str(tmp_path / "s.zarr"), "--tokenizer", str(tmp_path / "nosuch.json")])
    assert code == 1 and not read
    assert "tokenizer file not found" in cli_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("kw", [dict(key=1, domain="d", text="t"), dict(key="k", domain=3, text="t"),
                                dict(key="k", domain=None, text="t"), dict(key="k", domain="d", text=b"bytes")])  # fmt: skip
def test_a_document_s_names_and_text_are_strings(kw):
    """A domain of 3 among string domains was a TypeError from sorted() inside build_probe; bytes
    as text were tokenized as their repr or failed deep in the tokenizer."""
    from tokdyn.corpus import Document

    with pytest.raises(InputError, match="must be a str"):
        Document(**kw)
