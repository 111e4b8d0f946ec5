"""The headline sentences of each experiment, with every number read from ``results.json``.

The first sentence answers the study's question: who won and by how much (the experiment's ``ranking``: lm's
and mlp's lowest validation loss, rare-tokens' rarest-token error, landscapes' steps per surface; adder's best score; a
sweep's tuned winner with its interval), or, where the study is no race, its finding for every run (entropy's
slopes, edge-of-stability's edge). Every optimizer a run names, the user's own included, is named in the
sentences that follow.

A sentence is a list of text pieces and ``Number``s. A ``Number`` keeps the path of its value in
``results.json``, so the page marks each one (``data-path``) and a reader or a test can trace it back.
No number is computed here: each is a value the experiment recorded, shown to four significant digits.
A sentence whose values a result does not have (a diverged run has no final weights; a result written before
rankings were recorded) is left out.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..figures.edge_of_stability import edge_before_divergence
from ..figures.style import unrounded
from ..sweep import what_trials_did


@dataclass(frozen=True)
class Number:
    path: tuple[str | int, ...]
    value: float

    @property
    def text(self) -> str:
        return format_number(self.value)


Sentence = list[str | Number]


#: How a value that is no finite number reads on the page: in words, not Python's "nan" and "inf".
NON_FINITE = {"nan": "not a number (NaN)", "inf": "∞", "-inf": "−∞"}


def format_number(value: float) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)  # 10,010 of 10,010 cases
    if not math.isfinite(value):
        return NON_FINITE["nan" if math.isnan(value) else "inf" if value > 0 else "-inf"]
    return unrounded(value, lambda digits: f"{value:.{digits}g}", range(4, 9))  # four significant digits


def plural(count: int, one: str, many: str | None = None) -> str:
    """``count`` and the noun it counts: ``"1 finding"``, ``"3 findings"`` (``many``: an irregular plural)."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def separated(clauses: Iterable[Sentence], by: str = "; ") -> Sentence:
    """Several clauses as the pieces of one sentence, ``by`` between them."""
    out: Sentence = []
    for i, clause in enumerate(clauses):
        out += [by, *clause] if i else list(clause)
    return out


def lookup(results: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        results = results[key]
    return results


def number(results: dict[str, Any], *path: str | int) -> Number:
    value = lookup(results, path)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{path} is {value!r}, not a number")
    return Number(path, value)


def ahead(r: dict[str, Any], path: tuple[str | int, ...], second: str, value: Number, less: str = "below") -> Sentence:
    """The clause of a ranking's margin over the runner-up ``second`` (its number ``value``): ", 0.12 below adamw's
    2.64" (``less``: "below", "fewer than"), or ", tied with adamw" where the margin is 0. ``path``: the ranking's
    place in ``r``."""
    margin = number(r, *path, "margin")
    if margin.value == 0:
        return [f", tied with {second}"]
    return [", ", margin, f" {less} {second}'s ", value]


def ranked(r: dict[str, Any], path: tuple[str | int, ...], value: Callable[[str], Number]) -> Sentence:
    """Every run a ranking orders, best first, each with its number (``value``): "adam 0.01, sgd 0.9"."""
    order = lookup(r, (*path, "order"))
    return separated(([f"{name} ", value(name)] for name in order), ", ")


def headlines(results: dict[str, Any]) -> list[Sentence]:
    """The experiment's headline sentences (those its results have the numbers for)."""
    writer = WRITERS.get(results.get("experiment"))
    if writer is None:
        return []
    out = []
    missing = (KeyError, IndexError, TypeError)  # a result without a value that is read (e.g. a run diverged)
    with contextlib.suppress(*missing):  # met by the writer itself: the sentences so far stand
        for sentence in writer(results):
            with contextlib.suppress(*missing):  # met by one sentence: the others stand
                out.append(sentence())
    return out


# ------------------------------------------------------------------------------------------ rare-tokens
def rare_tokens(r: dict[str, Any]) -> Iterator[Callable[[], Sentence]]:
    # a run without SGD or Adam (one optimizer, a sweep's trial) has no pair: the sentences about it drop out
    pair = r.get("pair") or {}
    sgd, adam, k, c = pair.get("sgd"), pair.get("adam"), r["rarest"], r["most_common"]

    def n(*path):
        return number(r, *path)

    def error(name: str) -> Number:
        return n("optimizers", name, "final_error", k)

    def lead() -> Sentence:
        order = r["ranking"]["order"]
        out = [f"{order[0]} ends closest to the target on the rarest token (seen ", n("occurrences", k), " times): "]
        out += ["|w − w*| = ", error(order[0])]
        return [*out, *(ahead(r, ("ranking",), order[1], error(order[1])) if len(order) > 1 else []), "."]

    yield lead
    diverged = [name for name, o in r["optimizers"].items() if isinstance(o, dict) and o.get("diverged_at") is not None]
    yield lambda: [
        "The rarest token's error |w − w*| at the end, best first: ",
        *ranked(r, ("ranking",), error),
        *([f"; {', '.join(diverged)} diverged"] if diverged else []),
        ".",
    ]
    if diverged:
        yield lambda: [
            "Diverged: ",
            *separated([f"{name} at step ", n("optimizers", name, "diverged_at")] for name in diverged),
            ".",
        ]

    yield lambda: [
        "After ",
        n("steps"),
        " steps at η = ",
        n("lr"),
        ", SGD's rarest token (seen ",
        n("occurrences", k),
        " times) has weight ",
        n("optimizers", sgd, "final_weight", k),
        " against a target of ",
        n("true_weight"),
        "; Adam's has ",
        n("optimizers", adam, "final_weight", k),
        ".",
    ]
    yield lambda: [
        "Rarest-token error: Adam ",
        n("optimizers", adam, "final_error", k),
        ", SGD ",
        n("optimizers", sgd, "final_error", k),
        ".",
    ]

    def slope_clause() -> Sentence:
        # fewer than two tokens seen (or, in an older results.json, all equally frequent) determine no line: its
        # slope is nan, not stated; a fit that left unseen tokens out says over how many it ran
        fit = r["optimizers"][adam]["effective_lr_fit"]
        slope = n("optimizers", adam, "effective_lr_fit", "slope")
        if not math.isfinite(slope.value):
            return []
        fitted = fit.get("tokens", len(r["occurrences"]))
        over = [" over the ", n("optimizers", adam, "effective_lr_fit", "tokens"), " tokens seen"]
        over = over if fitted < len(r["occurrences"]) else []
        return ["; its log-log slope against frequency", *over, " is ", slope]

    # a token never drawn has v̂ = 0: its effective lr is η/ε, which says nothing of its frequency
    unseen = " (never seen: v̂ = 0, so η/ε)" if r["occurrences"][k] == 0 else ""
    yield lambda: [
        "Adam's effective learning rate at the end is ",
        n("optimizers", adam, "effective_lr", k),
        f" for the rarest token{unseen} and ",
        n("optimizers", adam, "effective_lr", c),
        " for the most common",
        *slope_clause(),
        ".",
    ]
    findings = (r.get("lr_sweep") or {}).get("findings", {})
    if findings.get("rescue_lr") is not None:
        yield lambda: [
            "A larger η lets SGD learn the rarest token from η = ",
            n("lr_sweep", "findings", "rescue_lr"),
            ", where the most common token's jitter (std) is ",
            n("lr_sweep", "findings", "rescue_common_tail_std"),
            *(
                [" (at η = ", n("lr"), " SGD diverged)."]
                if findings.get("nominal_common_tail_std") is None  # no jitter to compare with
                else [" against ", n("lr_sweep", "findings", "nominal_common_tail_std"), " at η = ", n("lr"), "."]
            ),
        ]
    else:
        yield lambda: [
            "No swept η lets SGD learn the rarest token (largest stable η: ",
            *_largest_stable(r, findings),
            ").",
        ]


def _largest_stable(r: dict[str, Any], findings: dict[str, Any]) -> Sentence:
    if findings.get("largest_stable_sgd_lr") is None:
        return ["none"]
    return [number(r, "lr_sweep", "findings", "largest_stable_sgd_lr")]


# ------------------------------------------------------------------------------------------- landscapes
def landscapes(r: dict[str, Any]) -> Iterator[Callable[[], Sentence]]:
    def n(*path):
        return number(r, *path)

    def clause(surface: str, name: str, run: dict[str, Any]) -> Sentence:
        """How one optimizer did on one surface."""
        grid = run.get("grid") or []
        if run["reached_at"] is None and grid and all(g.get("diverged_at") is not None for g in grid):
            return [f"{name} diverged at every η tried"]
        if run["reached_at"] is None:
            return [f"{name} never within ", n("steps")]
        where = ("surfaces", surface, "runs", name)
        return [f"{name} ", n(*where, "reached_at"), " (η = ", n(*where, "best_lr"), ")"]

    def fastest(surface: str) -> Sentence:
        order = r["surfaces"][surface]["ranking"]["order"]
        if not order:
            return [f"{surface}: none within ", n("steps"), " steps"]

        def steps(name: str) -> Number:
            return n("surfaces", surface, "runs", name, "reached_at")

        out = [f"{surface}: {order[0]}, ", steps(order[0]), " steps"]
        if len(order) > 1:
            out += ahead(r, ("surfaces", surface, "ranking"), order[1], steps(order[1]), "fewer than")
        return out

    yield lambda: [
        "Fastest to f − f* ≤ ",
        n("tolerance"),
        ", each optimizer at its best η: ",
        *separated(fastest(surface) for surface in r["surfaces"]),
        ".",
    ]
    for surface, data in r["surfaces"].items():

        def sentence(surface=surface, data=data) -> Sentence:
            clauses = separated(clause(surface, name, run) for name, run in data["runs"].items())
            return [f"{surface}: steps to f − f* ≤ ", n("tolerance"), " — ", *clauses, "."]

        yield sentence
    bc = ("bias_correction", "runs")
    bias_runs = r.get("bias_correction", {}).get("runs", {})
    diverged = [name for name, run in bias_runs.items() if run.get("diverged_at") is not None]
    if diverged:  # x stopped being finite: as the figure, say where, and compare no steps
        yield lambda: [
            "Bias correction: ",
            *separated([f"{name} diverged at step ", n(*bc, name, "diverged_at")] for name in diverged),
            " (x not finite), so the steps are not compared.",
        ]
    else:

        def without_and_with(key: str) -> Sentence:
            return [n(*bc, "adam-no-bc", key), " (with it ", n(*bc, "adam", key), ")"]

        yield lambda: [
            "Adam without bias correction: first step ",
            *without_and_with("first_step"),
            ", largest ",
            n(*bc, "adam-no-bc", "largest_step"),
            " at step ",
            n(*bc, "adam-no-bc", "largest_step_at"),
            ", overshoot ",
            *without_and_with("overshoot"),
            ".",
        ]
    wd = ("weight_decay", "runs")
    yield lambda: [
        "RMS distance to the L2-regularised optimum: Adam+L2 ",
        n(*wd, "adaml2", "rms_distance_to_l2_optimum"),
        ", AdamW ",
        n(*wd, "adamw", "rms_distance_to_l2_optimum"),
        "; skewness ",
        n(*wd, "adamw", "stats", "skewness"),
        " (AdamW) vs ",
        n(*wd, "adaml2", "stats", "skewness"),
        " (standard error ",
        n("weight_decay", "skewness_standard_error"),
        "); excess kurtosis ",
        n(*wd, "adamw", "stats", "excess_kurtosis"),
        " vs ",
        n(*wd, "adaml2", "stats", "excess_kurtosis"),
        ".",
    ]


# ---------------------------------------------------------------------------------------------------- lm
def validation_race(
    r: dict[str, Any], sweep: str, lead: Callable[[str], Sentence], detail: Callable[[str], Sentence]
) -> Iterator[Callable[[], Sentence]]:
    """The sentences of a race by final validation loss (lm, mlp): the winner with ``lead``'s clause and its margin,
    every run best first, then each run with ``detail``'s clause or the step it diverged at. ``sweep``: the
    experiment ``optiscope sweep`` would tune to measure the seed noise."""

    def loss(name: str) -> Number:
        return number(r, "runs", name, "final", "val_loss")

    def first() -> Sentence:
        order = r["ranking"]["order"]
        out = [f"{order[0]} reached the lowest validation loss, ", loss(order[0]), *lead(order[0])]
        if len(order) > 1:
            out += ahead(r, ("ranking",), order[1], loss(order[1]))
            out.append(f" (one seed per run: the seed noise is not measured; `optiscope sweep {sweep}` measures it)")
        return [*out, "."]

    yield first
    diverged = [name for name, run in r["runs"].items() if run["status"] != "ok"]
    yield lambda: [
        "Final validation loss, best first: ",
        *ranked(r, ("ranking",), loss),
        *([f"; {', '.join(diverged)} diverged"] if diverged else []),
        ".",
    ]
    for name, run in r["runs"].items():
        if run["status"] == "ok":
            yield lambda name=name: [f"{name}: final validation loss ", loss(name), *detail(name), "."]
        else:
            yield lambda name=name: [f"{name}: diverged at step ", number(r, "runs", name, "divergence", "step"), "."]


def lm(r: dict[str, Any]) -> Iterator[Callable[[], Sentence]]:
    def n(*path):
        return number(r, *path)

    yield from validation_race(
        r,
        "lm",
        lambda name: [" after ", n("runs", name, "final", "steps"), " steps"],
        lambda name: [
            ", perplexity ",
            n("runs", name, "final", "perplexity"),
            ", after ",
            n("runs", name, "final", "steps"),
            " steps",
        ],
    )
    # a diverged run's rows moved by its last, exploding steps: their order says nothing of token frequency
    rows = [
        name
        for name, run in r["runs"].items()
        if run["status"] == "ok" and math.isfinite(run["embedding_rows"]["spearman"])
    ]
    if rows:
        yield lambda: [
            "Spearman correlation of a token's frequency with how far its embedding row moves: ",
            *separated(([f"{name} ", n("runs", name, "embedding_rows", "spearman")] for name in rows), ", "),
            ".",
        ]


# ----------------------------------------------------------------------------------------------- entropy
def entropy(r: dict[str, Any]) -> Iterator[Callable[[], Sentence]]:
    def n(*path):
        return number(r, *path)

    def slopes(name: str) -> Sentence:
        fits = r["optimizers"][name]["fits"]
        finite = [i for i, fit in enumerate(fits) if math.isfinite(fit["slope"])]
        return separated(([n("optimizers", name, "fits", i, "slope")] for i in finite), ", ")

    yield lambda: [
        "Log-log slope of |ΔH_true| against η, run by run (1: the change is linear in the step size): ",
        *separated([f"{name} ", *slopes(name)] for name in r["optimizers"]),
        ".",
    ]
    for name, opt in r["optimizers"].items():
        yield lambda name=name, opt=opt: [
            f"{name} (η = ",
            n("optimizers", name, "lr"),
            "): log-log slope of |ΔH_true| against η ",
            *separated(
                (
                    [f"run {i}: ", n("optimizers", name, "fits", i, "slope")]
                    for i in range(len(opt["fits"]))
                    if math.isfinite(opt["fits"][i]["slope"])
                ),
                ", ",
            ),
            "; mean entropy change of its real step ",
            n("optimizers", name, "real_step", "entropy_mean"),
            ", of the validation loss ",
            n("optimizers", name, "real_step", "loss_mean"),
            ".",
        ]


# ------------------------------------------------------------------------------------------------- adder
def adder(r: dict[str, Any]) -> Iterator[Callable[[], Sentence]]:
    def n(*path):
        return number(r, *path)

    def run_score(i: int) -> Sentence:
        """'adamw seed 1: 10,010 of 10,010 correct (best at step 58,000'."""
        score = [n("runs", i, "correct"), " of ", n("cases"), " correct (best at step ", n("runs", i, "best_step")]
        return [f"{r['runs'][i]['label']} seed ", n("runs", i, "seed"), ": ", *score]

    def lead() -> Sentence:
        best = r["best"]
        i = next(i for i, run in enumerate(r["runs"]) if (run["label"], run["seed"]) == (best["label"], best["seed"]))
        perfect = sum(run["correct"] == r["cases"] for run in r["runs"])
        return ["Best score, ", *run_score(i), f"); {perfect} of {plural(len(r['runs']), 'run')} got every case."]

    yield lead
    yield lambda: [f"Model preset {r['preset']}: ", n("params"), " parameters, scored on ", n("cases"), " cases."]
    for i, run in enumerate(r["runs"]):
        diverged = ", diverged" if run["status"] != "ok" else ""
        yield lambda i=i, diverged=diverged: [
            *run_score(i),
            f"{diverged}; ",
            n("runs", i, "cpu_minutes"),
            " CPU minutes).",
        ]
    for name in r["success"]:
        yield lambda name=name: [
            f"{name}: ",
            n("success", name, "perfect"),
            " of ",
            n("success", name, "tried"),
            " seeds reached every case.",
        ]


# ------------------------------------------------------------------------------------- edge-of-stability
def edge_of_stability(r: dict[str, Any]) -> Iterator[Callable[[], Sentence]]:
    def n(*path):
        return number(r, *path)

    def lead() -> Sentence:
        reached, not_reached = [], []
        for i, run in enumerate(r["runs"]):
            if run["edge_step"] is not None and (run["status"] == "ok" or edge_before_divergence(run)):
                reached.append([f"{run['label']} at step ", n("runs", i, "edge_step")])
            elif run["status"] != "ok":
                not_reached.append([f"{run['label']} (diverged at step ", n("runs", i, "divergence", "step"), ")"])
            elif run.get("max_ratio") is not None:
                not_reached.append([f"{run['label']} (at most ", n("runs", i, "max_ratio"), "×)"])
            else:
                not_reached.append([f"{run['label']} (no finite ratio measured)"])
        out = ["The edge of stability (λ₁ at ", n("edge"), "× the run's own threshold)"]
        out += [" reached by ", *separated(reached, ", ")] if reached else [" reached by no run"]
        return [*out, *(["; not by ", *separated(not_reached, ", ")] if not_reached else []), "."]

    yield lead
    for i, run in enumerate(r["runs"]):
        what = "preconditioned sharpness λ₁(P⁻¹H)" if run["preconditioned"] else "sharpness λ₁(H)"
        at = ("runs", i)  # the pieces after the threshold: text, or the path of a number in results.json
        if run["status"] != "ok" and edge_before_divergence(run):
            tail = [": reached ", ("edge",), "× at step ", (*at, "edge_step"), ", then diverged at step "]
            tail += [(*at, "divergence", "step"), ", at most ", (*at, "max_ratio"), "× it."]
        elif run["status"] != "ok" and run.get("max_ratio") is None:  # its measurements, if any, were not finite
            tail = [": diverged at step ", (*at, "divergence", "step"), ", with no finite ratio measured before it."]
        elif run["status"] != "ok":
            tail = [": diverged at step ", (*at, "divergence", "step"), ", at most ", (*at, "max_ratio"), "× it."]
        elif run.get("max_ratio") is None:
            tail = [": no finite ratio measured in ", ("steps",), " steps."]
        elif run["edge_step"] is None:
            tail = [": at most ", (*at, "max_ratio"), f"× it, short of the edge ({r['edge']:g}×) in ", ("steps",)]
            tail.append(" steps.")
        else:
            tail = [": reached ", ("edge",), "× at step ", (*at, "edge_step"), ", then a median of "]
            tail += [(*at, "equilibrium"), "× (largest ", (*at, "max_ratio"), "×)."]
        head = f"{run['label']}: {what} against its {run['threshold_label']} threshold of "
        yield lambda at=at, head=head, tail=tail: [
            head,
            n(*at, "threshold"),
            *(n(*piece) if isinstance(piece, tuple) else piece for piece in tail),
        ]


# ------------------------------------------------------------------------------------------------- sweep
def sweep(r: dict[str, Any]) -> Iterator[Callable[[], Sentence]]:
    def n(*path):
        return number(r, *path)

    seeds = len(r["seeds"])
    fresh = "fresh_seeds" in r  # results written before sweeps ran fresh seeds report the tuning seeds
    over = "its fresh seeds" if fresh else "its seeds"

    def lead() -> Sentence:
        best = r["ranking"][0]
        t = ("optimizers", best)
        out = [f"{best} is best on {r['objective']['description']}: ", n(*t, "mean")]
        if len(r["optimizers"][best]["values"]) < 2:
            out.append(" (one seed: no interval)")
        elif all(math.isfinite(x) for x in r["optimizers"][best]["interval"]):
            out += [f" over {over} (95 % interval ", n(*t, "interval", 0), " … ", n(*t, "interval", 1), ")"]
        out += [" at its tuned η ", n(*t, "tuned_lr")]
        entry = r["neighbours"][0] if r["neighbours"] else None
        if entry is not None and all(math.isfinite(x) for x in (entry["difference"], *entry["interval"])):
            out += [f"; ahead of {entry['second']} by ", n("neighbours", 0, "difference"), " (Welch's 95 % interval "]
            out += [n("neighbours", 0, "interval", 0), " … ", n("neighbours", 0, "interval", 1), ": "]
            out.append(entry["verdict"].split(" — ")[-1] + ")")
        elif entry is not None:
            out.append(f"; against {entry['second']}: {entry['verdict'].split(' — ')[-1]}")
        return [*out, "."]

    yield lead
    yield lambda: [
        f"{r['swept']}: each optimizer's η tuned for {r['objective']['description']} "
        f"({r['objective']['direction']}imised), {plural(seeds, 'seed')} at the best η and its neighbours"
        + (f", then {plural(seeds, 'fresh seed')} at the tuned η, which the numbers below are of." if fresh else "."),
    ]

    def chose(name: str) -> Sentence:
        return [" The tuning seeds' mean there: ", n("optimizers", name, "tuning_mean"), "."] if fresh else []

    def edge(name: str) -> str:
        # the console's caveat too: a tuned η at an end of the grid is a bound on the optimum, not the optimum
        at_end = not r["optimizers"][name].get("interior", True)
        return " (at an end of the grid that was run: its optimum may lie beyond)" if at_end else ""

    for name in r["ranking"]:
        if len(r["optimizers"][name]["values"]) < 2:
            yield lambda name=name: [
                f"{name}: tuned η ",
                n("optimizers", name, "tuned_lr"),
                edge(name) + ", ",
                n("optimizers", name, "mean"),
                " (one seed).",
                *chose(name),
            ]
            continue
        yield lambda name=name: [
            f"{name}: tuned η ",
            n("optimizers", name, "tuned_lr"),
            edge(name) + ", ",
            n("optimizers", name, "mean"),
            " ± ",
            n("optimizers", name, "std"),
            f" over {over} (Student's t 95 % interval of the mean ",
            n("optimizers", name, "interval", 0),
            " … ",
            n("optimizers", name, "interval", 1),
            ").",
            *chose(name),
        ]
    for name in (name for name in r["optimizers"] if name not in r["ranking"]):
        yield lambda name=name: [f"{name}: no tuned η — {what_trials_did(r, name)}."]
    for i, entry in enumerate(r["neighbours"]):
        if not all(math.isfinite(x) for x in (entry["difference"], *entry["interval"])):
            yield lambda entry=entry: [entry["verdict"] + "."]  # no interval (a failed seed, or one seed): its words
            continue
        yield lambda i=i, entry=entry: [
            f"{entry['best']} vs {entry['second']}: Δ = ",
            n("neighbours", i, "difference"),
            ", Welch's 95 % interval ",
            n("neighbours", i, "interval", 0),
            " … ",
            n("neighbours", i, "interval", 1),
            ": " + entry["verdict"].split(" — ")[-1] + ".",  # the sweep's own words: beyond, within, not measured
        ]


# ------------------------------------------------------------------------------------------ mlp
def mlp(r: dict[str, Any]) -> Iterator[Callable[[], Sentence]]:
    def accuracy(name: str) -> Sentence:
        return [number(r, "runs", name, "final", "accuracy")]

    yield from validation_race(
        r, "mlp", lambda name: [" (accuracy ", *accuracy(name), ")"], lambda name: [", accuracy ", *accuracy(name)]
    )


WRITERS: dict[str, Callable[[dict[str, Any]], Iterator[Callable[[], Sentence]]]] = {
    "rare-tokens": rare_tokens,
    "landscapes": landscapes,
    "lm": lm,
    "entropy": entropy,
    "adder": adder,
    "edge-of-stability": edge_of_stability,
    "mlp": mlp,
    "sweep": sweep,
}
