"""``tokdyn probe``: a probe store from your own text, with your own tokenizer."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import tempfile

from .._files import check_output_path, not_a_folder, temporary_prefix
from .._text import labels, option_word, visible
from ..corpus import source_kind
from ..errors import InputError
from ..store import open_store
from ..tokenizer import check_bpe_vocab


def register(sub) -> None:
    p = sub.add_parser("probe", help="a probe store from a text folder, a JSONL file or a token .bin, split by document")
    p.add_argument("source", help="a folder of text files (domain: the first sub-folder), a text file, a .jsonl file, "
                                  "a token .bin file, or 'stdlib' / 'stdlib-mix'")  # fmt: skip
    p.add_argument("--out", required=True, metavar="STORE", help="the store to create (or an existing one with the same probe)")
    p.add_argument("--tokenizer", default="byte", metavar="NAME|PATH",
                   help="byte (default); bpe: a byte-level BPE of at most --bpe-vocab ids trained on the training side's documents "
                        "(written to --save-tokenizer FILE, to train the model with); a tokenizers JSON file; or a local HF "
                        "tokenizer folder holding tokenizer.json")
    p.add_argument("--save-tokenizer", metavar="FILE", help="with --tokenizer bpe: where its tokenizer.json goes (required: "
                        "the probe is only of use to a model trained with that tokenizer)")
    p.add_argument("--bpe-vocab", type=int, metavar="N", help="with --tokenizer bpe: the most ids it may have, 300 to 2**31 "
                   "(default: 1,024; a corpus with fewer merges to offer gives fewer)")
    p.add_argument("--eot", metavar="TOKEN", help="the tokenizer's end-of-text token (default: <|endoftext|>, </s>, ... if it has one)")
    p.add_argument("--context", type=int, default=128, help="tokens of context per probe sequence (default: 128)")
    p.add_argument("--sequences", type=int, default=128, help="probe sequences drawn (default: 128)")
    p.add_argument("--probe-fraction", type=float, default=0.05, help="share of documents held out for the probe (default: 0.05)")
    p.add_argument("--seed", type=int, default=0, help="draws the probe windows (default: 0); the split by document does not depend on it")
    p.add_argument("--text-field", help="with a .jsonl source: the field holding the text (default: text)")
    p.add_argument("--domain-field", help="with a .jsonl source: the field holding each document's domain label")
    p.add_argument("--bin-dtype", choices=("uint16", "uint32", "int32"),
                   help="with a .bin source: its token dtype (default: uint16; with a tokenizer of more than 65,536 ids, name it)")
    p.add_argument("--bin-eot-id", type=int, help="with a .bin source: the end-of-text id that separates its documents")
    p.add_argument("--held-out", metavar="FILE", help="write the held-out documents' keys here, one a line (never train on them; "
                        "read back with tokdyn.corpus.read_held_out)")
    p.set_defaults(func=_probe)


def _probe(args: argparse.Namespace) -> int:
    _check_arguments(args)  # before any work: reading and tokenizing a corpus can take minutes
    from ..corpus import held_out_text
    from ..data import prepare_probe  # imports torch: only for this command, not for every command's start

    tokenizer = args.tokenizer
    if tokenizer not in ("byte", "bpe"):  # loaded before the corpus is read: a wrong path fails at once, not after minutes
        from ..tokenizer import HFTokenizer

        tokenizer = HFTokenizer.from_file(tokenizer, eot="auto" if args.eot is None else args.eot)
    elif args.eot is not None:
        raise InputError(f"--eot names a token of a tokenizers file; the {args.tokenizer} tokenizer's end-of-text is its own"
                         + (" (256)" if args.tokenizer == "byte" else " (<|endoftext|>)"))
    held_tmp = _held_out_tmp(args.held_out) if args.held_out else None  # can we write there? find out now
    try:
        split = prepare_probe(args.source, tokenizer=tokenizer, context=args.context, n_sequences=args.sequences,
                              probe_fraction=args.probe_fraction, seed=args.seed, text_field=args.text_field or "text",
                              domain_field=args.domain_field, bin_dtype=args.bin_dtype, eot_id=args.bin_eot_id,
                              **({} if args.bpe_vocab is None else {"vocab_size": args.bpe_vocab}))  # fmt: skip
        added = _added_per_document(split)  # before the store is written: nothing is left behind by a failure
        if held_tmp is not None:  # one key a line: keys never hold a line break (tokdyn.corpus.held_out_text)
            with open(held_tmp, "w", encoding="utf-8", newline="") as fh:
                fh.write(held_out_text(d.key for d in split.probe_documents))
        store = open_store(args.out, split.probe, mode="a")
        if args.save_tokenizer:  # after the store: a failure here leaves a store a rerun with these arguments completes
            split.tokenizer.save(args.save_tokenizer)
        if held_tmp is not None:
            os.replace(held_tmp, args.held_out)
            held_tmp = None
    finally:
        if held_tmp is not None:  # failed: leave no temporary file behind
            with contextlib.suppress(OSError):
                os.unlink(held_tmp)
    p = split.probe
    # paths and names shown with every character visible: a newline in a folder's name printed a line of its own
    print(visible(f"probe {p.fingerprint}: {p.n_tokens:,} tokens = {p.n_sequences} sequences x {p.context} in {store.url}"))
    print(visible(f"  documents  {len(split.train_documents):,} for training, {len(split.probe_documents):,} held out "
                  f"({len(p.documents)} of them in the probe)" + (f"; held-out keys in {args.held_out}" if args.held_out else "")))  # fmt: skip
    if split.train_copies:  # the split is by key: a copy of a held-out text under another key is on the training side
        n, shown = len(split.train_copies), ", ".join(split.train_copies[:3])
        print(f"  copies     {n:,} training document(s) repeat the text of a held-out one ({shown}"
              + (f" and {n - 3:,} more" if n > 3 else "") + "): leave them out of training too "
              "(tokdyn.data.training_copies(train_docs, probe_docs) lists them)")  # fmt: skip
    if len(p.domains) > 1 or (p.domains and p.domains[0] != ""):
        print(f"  domains    {', '.join(labels(p.domains))}")
    tok = dict(p.tokenizer)
    eot = "none (tokdyn places no separator between documents)" if tok.get("eot_id") is None else tok.get("eot_id")
    print(f"  tokenizer  {tok.get('kind')}, vocabulary {tok.get('vocab_size'):,}, end-of-text id {eot}"
          + (f" ({visible(tok['eot'])})" if tok.get("eot") else "")
          + (visible(f"; trained here, saved to {args.save_tokenizer}") if args.save_tokenizer else ""))  # fmt: skip
    if added[0] or added[1]:  # the post-processor's template ([CLS] ... [SEP], <s> ...): in every document, said
        where = " and ".join(f"{' '.join(t)} {side}" for t, side in zip(added, ("before", "after")) if t)
        print(f"  adds       {visible(where)} every document (the tokenizer's post-processor): in the probe and in a training stream")
    print(visible(f"next: tokdyn record-offline --checkpoints DIR {option_word('--out', args.out)} --run NAME, or in a training loop "
                  f"TokenLossRecorder(model, tokdyn.open_store({args.out!r}).probe, {args.out!r}, NAME, schedule=...)"))  # fmt: skip
    return 0


def _added_per_document(split) -> tuple[list[str], list[str]]:
    """The special tokens the tokenizer adds around every document it encodes, found on the text
    of probe documents (the probe has encoded them; a closed vocabulary, a WordLevel one without
    its unknown token, encodes no other text), or none for a token file: its tokens are taken as
    they are, never encoded."""
    # whole documents (a piece cut from one may end in a word the vocabulary lacks), the shortest
    texts = sorted((d.text for d in split.probe_documents if d.text), key=len)[:3]
    if not texts or not hasattr(split.tokenizer, "added_per_document"):
        return [], []
    return split.tokenizer.added_per_document(texts)


def _check_arguments(args: argparse.Namespace) -> None:
    """The numbers and output paths, checked before any work (the library checks the numbers
    again, but only after reading the corpus)."""
    read_with_source = _read_with_source_test(args.source)  # the source's folders listed once for the checks below
    if args.seed < 0:
        raise InputError(f"--seed must be an integer >= 0, got {args.seed}")
    if args.context < 1:
        raise InputError(f"--context must be an integer >= 1, got {args.context}")
    if args.sequences < 1:
        raise InputError(f"--sequences must be an integer >= 1, got {args.sequences}")
    if not 0.0 < args.probe_fraction < 1.0:
        raise InputError(f"--probe-fraction must be in (0, 1), got {args.probe_fraction}")
    # Options of one kind of source, given with another, would be ignored: the source would be read
    # as something else than meant (a token file not named .bin, as text).
    kind = source_kind(args.source)
    for option, value, wants in (("--text-field", args.text_field, "jsonl"), ("--domain-field", args.domain_field, "jsonl"),
                                 ("--bin-dtype", args.bin_dtype, "bin"), ("--bin-eot-id", args.bin_eot_id, "bin")):  # fmt: skip
        if value is not None and kind != wants:
            raise InputError(f"{option} applies to a .{wants} source; {args.source} is read as "
                             + {"jsonl": "JSON lines", "bin": "a token file", None: "text"}[kind]
                             + (" (a token file must be named *.bin)" if wants == "bin" and kind is None else ""))
    if args.tokenizer == "bpe":
        if not args.save_tokenizer:
            raise InputError("--tokenizer bpe trains a tokenizer here: name the file to save it in, --save-tokenizer FILE "
                             "(the store keeps only its hash, and a model must be trained with it)")  # fmt: skip
        if kind == "bin":
            raise InputError(f"--tokenizer bpe trains on text; {args.source} is a token file, whose ids are already a "
                             "tokenizer's: give that one (--tokenizer PATH)")  # fmt: skip
        if args.bpe_vocab is not None:
            check_bpe_vocab(args.bpe_vocab, "--bpe-vocab")
        check_output_path(args.save_tokenizer, what="tokenizer (--save-tokenizer)")
        for option, path in (("--out", args.out), ("--held-out", args.held_out)):  # one would overwrite the other
            if path is not None and "://" not in path and os.path.realpath(path) == os.path.realpath(args.save_tokenizer):
                raise InputError(f"--save-tokenizer {args.save_tokenizer} is the {option} path too; give each its own path")
        if os.path.exists(args.source) and read_with_source(args.save_tokenizer):
            raise InputError(f"--save-tokenizer {args.save_tokenizer} is part of the source {args.source}; the tokenizer "
                             "would be read as a document the next time: give a path outside it (or in a hidden folder of it)")  # fmt: skip
    else:
        for option, value in (("--save-tokenizer", args.save_tokenizer), ("--bpe-vocab", args.bpe_vocab)):
            if value is not None:
                raise InputError(f"{option} is for the tokenizer --tokenizer bpe trains; {args.tokenizer} is not trained here")
    if args.tokenizer not in ("byte", "bpe") and os.path.isdir(args.source) and os.path.exists(args.tokenizer) \
            and read_with_source(args.tokenizer):  # fmt: skip
        raise InputError(f"--tokenizer {args.tokenizer} is part of the source {args.source}; its files would be read as "
                         "documents (trained on, or in the probe): move it out of the source, or into a hidden folder of it")
    out = args.out
    if "://" not in out and os.path.lexists(out):
        if not os.path.isdir(out):
            there = not_a_folder(out)
            raise InputError(f"--out: {there}; give a new path or an existing store")
        if os.listdir(out) and not os.path.exists(os.path.join(out, "zarr.json")):
            raise InputError(f"--out {out} is a folder that holds files but no store; give a new path or an existing store")
    elif "://" not in out:  # a new store: the folder it goes in must exist (as for every output)
        check_output_path(out, what="store (--out)", folder_ok=True)
    if "://" not in out and os.path.isdir(args.source) and read_with_source(out):
        raise InputError(f"--out {out} is inside the source folder {args.source}; the store's own files would be read "
                         "as documents the next time; give a path outside the source (or in a hidden folder of it)")  # fmt: skip
    held = args.held_out
    if held is None:
        return
    check_output_path(held, what="held-out keys (--held-out)")
    if "://" not in out and os.path.abspath(held) == os.path.abspath(out):
        raise InputError(f"--held-out {held} is the --out store's path; give another file")
    if os.path.exists(args.source) and read_with_source(held):
        raise InputError(f"--held-out {held} is part of the source {args.source}; writing the keys there would change the corpus")
    if args.tokenizer not in ("byte", "bpe"):  # a tokenizer file, or a folder of its files (tokdyn.tokenizer.HFTokenizer)
        tok = os.path.realpath(args.tokenizer)
        files = [os.path.join(tok, n) for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")]
        if os.path.realpath(held) in (files if os.path.isdir(tok) else [tok]):
            raise InputError(f"--held-out {held} is a file of the --tokenizer {args.tokenizer}; writing the keys there "
                             "would replace it: give another file")  # fmt: skip


def _read_with_source_test(source: str):
    """A test of whether a path is the ``source`` or would be read with it: a file or folder under
    the source folder or a folder linked in it (read as part of it), unless inside a hidden one
    (``.name``: never read as documents). The source's folders are listed (a walk of the whole
    tree) once, for every path the test is asked about."""

    @functools.cache
    def folders() -> list:
        from ..corpus import source_folders

        return source_folders(source)

    def read(path: str) -> bool:
        target = os.path.realpath(path)
        if target == os.path.realpath(source):
            return True
        if not os.path.isdir(source):
            return False
        for folder in folders():
            parts = os.path.relpath(target, folder).split(os.sep)
            if parts[0] != ".." and not any(part.startswith(".") for part in parts):
                return True
        return False

    return read


def _held_out_tmp(held: str) -> str:
    """A new temporary file beside ``held`` (the keys are written there, then moved into place)."""
    folder, name = os.path.split(os.path.abspath(held))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{temporary_prefix(name)}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(f"--held-out {held}: cannot write in {folder}: {exc.strerror or exc}") from None
    os.close(fd)
    return tmp
