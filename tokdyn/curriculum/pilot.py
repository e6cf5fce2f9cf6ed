"""The pilot: record and fit trajectories of tokens drawn from the *training* pool.

The curriculum needs learning times of the tokens it will reweight, so the pilot's probe is a
random set of training samples (windows of the training stream), not validation text. For a
mixture of domains, :func:`split_pilot_pool` holds some training documents out of the pilot's own
training and draws its probe there: learning times of text the pilot has not memorised, which
generalise to the run (docs/curriculum.md). The pilot
is an ordinary recorded run (:func:`tokdyn.train.record_tiny_run`, or your own loop with
:class:`~tokdyn.record.TokenLossRecorder` on :func:`pilot_probe`), fitted with
:func:`tokdyn.fit.fit_run`; :func:`~tokdyn.curriculum.build_table` then reads its events.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from .._checks import is_int, is_real
from ..data import Corpus, WindowDataset
from ..errors import InputError
from ..model import GPTConfig
from ..probe import ProbeSet
from ..train import TrainConfig, record_tiny_run
from ._common import domain_names

__all__ = ["pilot_probe", "run_pilot", "mixture_probe", "run_mixture_pilot", "PilotSplit", "split_pilot_pool"]


def _count(name: str, v) -> int:
    """``v`` as an int >= 1, or one :class:`InputError` naming ``name`` (a float such as 2.5 was
    silently cut to 2 windows, and 0 or -1 failed inside numpy)."""
    if not is_int(v) or v < 1:
        raise InputError(f"{name} must be an int >= 1, got {v!r}")
    return int(v)


def _seed(name: str, v) -> int:
    """``v`` as a seed numpy takes (an int >= 0), or one :class:`InputError` naming ``name``."""
    if not is_int(v) or v < 0:
        raise InputError(f"{name} must be an int >= 0, got {v!r}")
    return int(v)


def pilot_probe(stream: np.ndarray, *, context: int, n_sequences: int, tokenizer: dict, seed: int = 0) -> ProbeSet:
    """A probe of ``n_sequences`` training samples (windows ``[C+1]`` of ``stream``, as numbered by
    :class:`~tokdyn.data.WindowDataset`), drawn uniformly without replacement and kept in order.

    Its ``doc_pos`` is the target's offset in the training stream; ``tokenizer`` is the spec
    (``tokenizer.spec()``) stored with the probe, which the learnability table keeps.
    """
    n_sequences, seed = _count("n_sequences", n_sequences), _seed("seed", seed)
    ds = WindowDataset(stream, context=context)
    if n_sequences > len(ds):
        raise InputError(f"the training stream holds {len(ds)} windows of {context + 1} tokens; asked for {n_sequences}")
    if not isinstance(tokenizer, dict) or not tokenizer.get("vocab_size"):
        raise InputError("tokenizer must be the training tokenizer's spec() dict, with its vocab_size")
    pick = np.sort(np.random.default_rng(seed).choice(len(ds), size=int(n_sequences), replace=False))
    windows = ds.windows()[pick]
    return ProbeSet.from_tokens(
        windows,
        doc_offset=pick.astype(np.int64) * ds.context,
        domains=("train",),
        documents=("training stream",),
        tokenizer=tokenizer,
    )


def run_pilot(
    store: str | os.PathLike,
    *,
    corpus: Corpus,
    run: str = "pilot",
    model_config: GPTConfig | None = None,
    train_config: TrainConfig = TrainConfig(),
    n_sequences: int = 256,
    n_points: int = 40,
    probe_seed: int = 0,
    device: str = "cpu",
    fit: bool = True,
    progress: bool = False,
) -> dict:
    """Train the tiny GPT on ``corpus``'s training stream while recording a probe drawn from that
    stream (:func:`pilot_probe`) into ``store``, then fit every token (``fit=True``).

    Returns the training summary with ``fit`` (the :func:`~tokdyn.fit.fit_run` summary).
    """
    if not isinstance(corpus, Corpus):
        raise InputError(f"corpus must be a tokdyn.data.Corpus, got {type(corpus).__name__}")
    context = model_config.context if model_config is not None else corpus.probe.context
    probe = pilot_probe(corpus.train_tokens, context=context, n_sequences=n_sequences,
                        tokenizer=corpus.tokenizer.spec(), seed=probe_seed)  # fmt: skip
    stats = record_tiny_run(os.fspath(store), run=run, corpus=dataclasses.replace(corpus, probe=probe),
                            model_config=model_config, train_config=train_config, n_points=n_points,
                            device=device, progress=progress)  # fmt: skip
    if fit:
        from ..fit.job import fit_run
        from ..store import open_store

        stats["fit"] = fit_run(open_store(store, mode="r+").run(run), progress=progress).summary()
    return stats


def _domains_of(dataset, domains) -> tuple[str, ...]:
    """The names of ``dataset``'s domains in the order of its ``domain_ids``: its own
    (``dataset.domains``), which ``domains``, where given, must equal. A probe token is labelled
    by the dataset's domain id, and the schedule and the sampler look domains up by name: other
    names, or the same in another order, gave each domain another's tokens, without an error."""
    own = getattr(dataset, "domains", None)
    own = None if own is None else tuple(str(d) for d in own)
    if domains is None:
        if own is None:
            raise InputError("the dataset does not name its domains: pass domains=, its names in the order of its domain ids")
        return own
    names = domain_names(domains)
    if own is not None and names != own:
        raise InputError(f"domains {list(names)} are not the dataset's domains {list(own)} in its order (a probe token is "
                         "labelled by the dataset's domain id): leave domains out to take the dataset's")  # fmt: skip
    if len(names) != len(dataset.counts):
        raise InputError(f"domains has {len(names)} names; the dataset has {len(dataset.counts)} domains")
    return names


def mixture_probe(dataset, *, per_domain: int, domains=None, tokenizer: dict, seed: int = 0) -> ProbeSet:
    """A probe of ``per_domain`` training windows of each domain of a
    :class:`~tokdyn.data.MixtureDataset`, labelled by domain (``probe.token_arrays["domain"]``
    is the index into ``domains``: the dataset's domains, which ``domains``, where given, must
    be, in their order); ``doc_offset`` is the sample index in the pool."""
    per_domain, seed = _count("per_domain", per_domain), _seed("seed", seed)
    domains = _domains_of(dataset, domains)
    rng = np.random.default_rng(seed)
    picks = []
    for k, n in enumerate(dataset.counts):
        if per_domain > n:
            raise InputError(f"domain {domains[k]!r} has {n} training windows; asked for {per_domain}")
        picks.append(dataset.starts[k] + np.sort(rng.choice(int(n), size=int(per_domain), replace=False)))
    pick = np.concatenate(picks)
    windows = np.stack([dataset[int(i)].numpy() for i in pick])
    return ProbeSet.from_tokens(windows, doc_offset=pick.astype(np.int64), domain=dataset.domain_ids[pick].astype(np.int32),
                                domains=tuple(domains), documents=("training pool",), tokenizer=tokenizer)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class PilotSplit:
    """Training documents held out from the pilot, so that its probe is text it never trained on
    and the schedule never sees the measurement's validation documents.

    In each domain the tail of the training stream, from the first document boundary at or after
    ``1 - share`` of its windows, is held out: the pilot draws no window that reaches into it
    (``excluded``), and its probe is drawn from the windows that lie wholly inside it (``held``).
    The arms still train on the whole pool: the pilot is a separate run.
    """

    excluded: np.ndarray  # bool [N]: windows the pilot never draws
    held: np.ndarray  # bool [N]: windows inside the held-out documents (the probe's pool)
    boundary: tuple[bool, ...]  # per domain: whether the cut fell on a document boundary

    def pilot_probabilities(self, base: np.ndarray, domain_ids: np.ndarray) -> np.ndarray:
        """``base`` with the excluded windows removed, each domain keeping its total share."""
        base = np.asarray(base, np.float64)
        p = np.where(self.excluded, 0.0, base)
        want = np.bincount(domain_ids, weights=base)
        have = np.bincount(domain_ids, weights=p, minlength=want.size)
        if np.any((want > 0) & ~(have > 0)):
            raise InputError("holding out the pilot's documents left a domain with no window to train the pilot on")
        scale = np.divide(want, have, out=np.zeros_like(want), where=have > 0)
        return p * scale[domain_ids]

    def probe(self, dataset, *, per_domain: int, domains=None, tokenizer: dict) -> ProbeSet:
        """``per_domain`` held-out windows of each domain, spread evenly over its held-out tail
        (labelled as by :func:`mixture_probe`)."""
        per_domain = _count("per_domain", per_domain)
        domains = _domains_of(dataset, domains)
        picks = []
        for k in range(len(dataset.counts)):
            idx = np.flatnonzero(self.held & (dataset.domain_ids == k))
            if idx.size < per_domain:
                raise InputError(f"domain {domains[k]!r}: {idx.size} windows held out from the pilot; "
                                 f"the probe needs {per_domain} (use a larger share or fewer probe windows)")  # fmt: skip
            picks.append(idx[np.linspace(0, idx.size - 1, int(per_domain)).round().astype(np.int64)])
        pick = np.concatenate(picks)
        windows = np.stack([dataset[int(i)].numpy() for i in pick])
        return ProbeSet.from_tokens(windows, doc_offset=pick.astype(np.int64), domain=dataset.domain_ids[pick].astype(np.int32),
                                    domains=tuple(domains), documents=("training documents held out from the pilot",),
                                    tokenizer=tokenizer)  # fmt: skip


def split_pilot_pool(dataset, *, eot_id: int | None, share: float = 0.1) -> PilotSplit:
    """Hold the last ``share`` of each domain's training documents out of the pilot
    (:class:`PilotSplit`). The cut moves forward to the next end-of-text token ``eot_id`` so that
    no document is on both sides; without one (``eot_id`` None, or none after the cut) it stays
    at the window cut and ``boundary`` says so."""
    if not is_real(share) \
            or not 0.0 < float(share) < 1.0:  # fmt: skip
        raise InputError(f"the pilot's held-out share must be a number in (0, 1), got {share!r}")
    n = len(dataset)
    excluded, held, bounds = np.zeros(n, bool), np.zeros(n, bool), []
    for k, part in enumerate(dataset.parts):
        c, m = part.context, len(part)
        cut = int(np.floor((1.0 - share) * m)) * c  # stream position of the window cut
        b, on_doc = cut, False
        if eot_id is not None:
            after = np.flatnonzero(part.stream[cut : m * c + 1] == eot_id)
            if after.size:
                b, on_doc = cut + int(after[0]), True
        j = np.arange(m)
        start = int(dataset.starts[k])
        excluded[start : start + m] = j * c + c > b  # the window reaches past the boundary
        held[start : start + m] = j * c >= b  # the window starts at or after it
        bounds.append(on_doc)
    return PilotSplit(excluded, held, tuple(bounds))


def run_mixture_pilot(
    store: str | os.PathLike,
    *,
    dataset,
    domains=None,
    batches,
    model_config: GPTConfig,
    train_config: TrainConfig,
    tokenizer: dict,
    per_domain: int = 32,
    n_points: int = 30,
    run: str = "pilot",
    device: str = "cpu",
    probe: ProbeSet | None = None,
) -> dict:
    """Train the tiny GPT on ``batches`` (the baseline mixture) while recording
    :func:`mixture_probe` (or ``probe``) into ``store``, then fit every token. Returns the training summary
    with ``fit``; :func:`~tokdyn.curriculum.mixture.pilot_events` reads the events back."""
    import torch

    from ..fit.job import fit_run
    from ..model import TinyGPT
    from ..record import TokenLossRecorder
    from ..schedule import geometric_schedule
    from ..train import train

    if probe is None:
        probe = mixture_probe(dataset, per_domain=per_domain, domains=domains, tokenizer=tokenizer, seed=train_config.seed)
    torch.manual_seed(train_config.seed)
    model = TinyGPT(model_config).to(device)
    attrs = {"model_config": model_config.to_dict(), "seed": train_config.seed,
             "tokens_per_step": train_config.batch_size * model_config.context}  # fmt: skip
    with TokenLossRecorder(model, probe, os.fspath(store), run, schedule=geometric_schedule(train_config.steps, n_points),
                           device=device, run_attrs=attrs, rank=0, world_size=1) as rec:  # fmt: skip (one process trains)
        stats = train(model, batches, train_config, recorder=rec)
    from ..store import open_store

    stats["fit"] = fit_run(open_store(os.fspath(store), mode="r+").run(run), progress=False).summary()
    return stats
