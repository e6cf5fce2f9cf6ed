"""Measurement: how much wider is the spectrum exponent's interval when the bootstrap resamples
the probe's documents (or windows) whole instead of tokens one by one?

Tokens of one document are not independent draws, so the token bootstrap reads a probe as more
data than it holds. This script prints one JSON line per case:

- the positive controls: planted power-law events, each token copied ``k`` times into one
  document (``k`` 1 and 9, several seeds). Resampling documents must give the interval of one
  token a document (the ratio of widths to that: 1); resampling the copies one by one must
  be about sqrt(k) narrower (ratio of the documents' width to the tokens': about 3 at k 9).
- every fitted T run of the stores named: the width over its probe's units (documents, or
  windows where the probe does not tell documents apart) divided by the width over tokens,
  for several bootstrap seeds;
- and where the run's probe is labelled by domain (a curriculum pilot's): the curriculum's
  domain rates (``DomainRates.from_events``), whose differences from the domains' mean are
  shrunk by two bootstrap errors; the share of that spread left after the shrinkage, and the
  schedule's enrichment (``MixtureSchedule``, default config over ``--steps``), with the
  errors over the units and over tokens.

    python pipelines/spectrum_units.py [STORE ...] [--boot 200] [--seeds 5] [--steps 500]
"""

from __future__ import annotations

import argparse
import json
import warnings
from dataclasses import replace

import numpy as np

import tokdyn
from tokdyn.errors import InputError
from tokdyn.spectrum import Events, run_events, spectrum_power_law


def power_law_events(n: int, seed: int, decades: float = 4.0, alpha: float = 0.5) -> Events:
    """One event per token, learning times drawn from a density proportional to 10**(-alpha x)."""
    rng = np.random.default_rng(seed)
    lo, hi = 0.1 * decades, 0.9 * decades
    u = rng.uniform(size=n)
    a, b = 10 ** (-alpha * lo), 10 ** (-alpha * hi)
    mu = -np.log10(a - u * (a - b)) / alpha  # inverse CDF
    drop = rng.uniform(0.5, 3.0, n)
    return Events(np.arange(n), mu, np.full(n, 0.15), drop, n, (0.0, decades), resolution=decades / 29)


def copies_as_documents(base: Events, k: int) -> Events:
    """Each token of ``base`` as ``k`` identical tokens, one document (unit) of k tokens."""
    tok = (base.token[:, None] * k + np.arange(k)[None, :]).reshape(-1)
    rep = lambda a: np.repeat(a, k)  # noqa: E731
    return Events(tok, rep(base.mu), rep(base.s), rep(base.delta), base.n_tokens * k, base.x_range, rep(base.well_fitted),
                  base.resolution, unit=np.arange(base.n_tokens * k) // k, unit_kind="document")  # fmt: skip


def _width(pl) -> float:
    return float(pl.alpha_hi - pl.alpha_lo)


def controls(n_boot: int, seeds: int) -> None:
    for k in (1, 9):
        same, narrow = [], []
        for seed in range(seeds):
            base = power_law_events(150, seed)
            one = spectrum_power_law(base, n_boot=n_boot, seed=seed)
            docs = copies_as_documents(base, k)
            by_doc = spectrum_power_law(docs, n_boot=n_boot, seed=seed)
            by_token = spectrum_power_law(replace(docs, unit=None, unit_kind="token"), n_boot=n_boot, seed=seed)
            same.append(_width(by_doc) / _width(one))
            narrow.append(_width(by_doc) / _width(by_token))
        print(json.dumps({"case": "planted copies", "k": k, "documents": 150, "seeds": seeds,
                          "documents_over_one_token_a_document": [round(v, 4) for v in same],
                          "documents_over_tokens_median": round(float(np.median(narrow)), 3),
                          "documents_over_tokens": [round(v, 3) for v in narrow], "expected": round(k ** 0.5, 3)}))  # fmt: skip


def stores(urls: list[str], n_boot: int, seeds: int, steps: int) -> None:
    for url in urls:
        st = tokdyn.open_store(url)
        for name in st.runs:
            run = st.run(name)
            if run.axis != "T" or not run.fit.exists:
                continue
            ev = run_events(run)
            out = {"case": "store", "store": url, "run": name, "tokens": ev.n_tokens, "resampled": f"{ev.unit_kind}s",
                   "units": int(ev.units()[1])}  # fmt: skip
            try:
                ratios = [_width(spectrum_power_law(ev, n_boot=n_boot, seed=s))
                          / _width(spectrum_power_law(replace(ev, unit=None, unit_kind="token"), n_boot=n_boot, seed=s))
                          for s in range(seeds)]  # fmt: skip
            except InputError as exc:
                out["no_power_law"] = str(exc)
            else:
                out.update(alpha=round(spectrum_power_law(ev, n_boot=0).alpha, 4), width_ratio=[round(r, 3) for r in ratios],
                           width_ratio_median=round(float(np.median(ratios)), 3))  # fmt: skip
            print(json.dumps(out))
            if "domain" in st.probe.token_arrays:
                print(json.dumps({"case": "domain rates", "store": url, "run": name, **domain_rates(st, name, steps)}))


def domain_rates(st, run: str, steps: int) -> dict:
    """The curriculum's domain rates of a pilot, errors over its units and over tokens: the share
    of the domains' spread about their mean rate that the shrinkage leaves, and the enrichment."""
    from tokdyn.curriculum.mixture import DomainRates, MixtureConfig, MixtureSchedule, pilot_events

    pe = pilot_events(st.url, run)
    raw = DomainRates.from_events(pe.events, pe.token_domain, pe.domains, significance=0).rates
    spread = lambda r: float(np.abs(r - r.mean(1, keepdims=True)).sum())  # noqa: E731
    out = {"probe_tokens": pe.events.n_tokens}
    for key, ev in (("units", pe.events), ("tokens", replace(pe.events, unit=None, unit_kind="token"))):
        rates = DomainRates.from_events(ev, pe.token_domain, pe.domains)
        e = MixtureSchedule(rates, MixtureConfig(total_steps=steps)).enrichment()
        out[key] = {"resampled": rates.noise["resampled"], "n_units": rates.noise["n_units"],
                    "spread_kept": round(spread(rates.rates) / spread(raw), 4), "enrichment": round(e["schedule"], 4),
                    "best": round(e["best"], 4), "best_unshrunk": round(e["best_unshrunk"], 4)}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stores", nargs="*", help="stores whose fitted T runs to measure")
    ap.add_argument("--boot", type=int, default=200, help="bootstrap resamples (default: 200, as the spectrum command)")
    ap.add_argument("--seeds", type=int, default=5, help="bootstrap seeds a case (default: 5)")
    ap.add_argument("--steps", type=int, default=500, help="a domain-labelled pilot's schedule: its steps (default: 500, the A/B's)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    controls(args.boot, args.seeds)
    stores(args.stores, args.boot, args.seeds, args.steps)


if __name__ == "__main__":
    main()
