"""Make the traces shipped in traces/: a synthetic two-week mix (the default), or a whatif trace
derived from the Azure LLM inference traces (CC-BY-4.0) when you have their CSV files.

    python traces/make.py > traces/weekly-mix.csv
    python traces/make.py --azure AzureLLMInferenceTrace_code_1week.csv --model code > code.csv

The synthetic mix is not measured traffic: it is drawn (seeded, so the file is reproducible)
from a shape that follows what the Azure traces' publications describe (Patel et al.,
"Splitwise", ISCA 2024; Stojkovic et al., "DynamoLLM", HPCA 2025): conversation traffic with a
strong daily cycle and quiet weekends, code traffic in bursts during working hours, and, as
seen in most clusters, scheduled jobs at fixed times and a model that is asked rarely.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

START = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday
DAYS = 14
SEED = 18


def synthetic(seed: int = SEED) -> list[tuple[float, str, int]]:
    rng = random.Random(seed)
    out: list[tuple[float, str, int]] = []
    for day in range(DAYS):
        midnight = START + timedelta(days=day)
        weekday = midnight.weekday() < 5
        base = midnight.timestamp()
        # chat: a Poisson stream whose rate follows the working day.
        t = 0.0
        while t < 86400:
            hour = t / 3600
            if weekday and 8 <= hour < 18:
                rate = 1 / 90
            elif 7 <= hour < 22:
                rate = 1 / 1800 if weekday else 1 / 2400
            else:
                rate = 1 / 7200
            t += rng.expovariate(rate)
            if t < 86400:
                out.append((base + t, "chat", rng.randint(50, 600)))
        # code: sessions of quick requests in working hours, on weekdays.
        if weekday:
            for _ in range(rng.randint(3, 6)):
                t = rng.uniform(9 * 3600, 17 * 3600)
                for _ in range(rng.randint(15, 50)):
                    out.append((base + t, "code", rng.randint(20, 300)))
                    t += rng.uniform(5, 60)
        # report: a job at 06:00 on weekdays, a few requests.
        if weekday:
            t = 6 * 3600 + rng.uniform(0, 90)
            for _ in range(rng.randint(3, 6)):
                out.append((base + t, "report", rng.randint(300, 800)))
                t += rng.uniform(2, 20)
        # triage: a nightly job at 02:30, every day.
        t = 2.5 * 3600 + rng.uniform(0, 60)
        for _ in range(3):
            out.append((base + t, "triage", rng.randint(100, 400)))
            t += rng.uniform(1, 10)
        # rare: a model asked about every three hours, at random.
        t = rng.expovariate(1 / 10800)
        while t < 86400:
            out.append((base + t, "rare", rng.randint(50, 300)))
            t += rng.expovariate(1 / 10800)
    out.sort()
    return out


def azure(path: Path, model: str, sample: float, seed: int) -> list[tuple[float, str, int]]:
    """Rows of an Azure LLM inference trace (TIMESTAMP, ContextTokens, GeneratedTokens), kept
    with probability `sample`."""
    rng = random.Random(seed)
    out = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if rng.random() >= sample:
                continue
            stamp = row["TIMESTAMP"].strip()
            # "2023-11-16 18:15:46.6805900": more fractional digits than Python reads.
            head, _, frac = stamp.partition(".")
            at = datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp()
            at += float(f"0.{frac}") if frac else 0.0
            out.append((at, model, int(row["GeneratedTokens"])))
    out.sort()
    return out


HEADER = {
    "synthetic": (
        "SYNTHETIC, not measured: two weeks drawn (seed {seed}) by traces/make.py from a shape\n"
        "that follows the published descriptions of Azure's LLM inference traces. Models: chat\n"
        "(daily cycle, quiet weekends), code (bursts in working hours), report (06:00 on\n"
        "weekdays), triage (02:30 daily), rare (about every three hours, at random)."
    ),
    "azure": (
        "Derived by traces/make.py from {source}, part of the Azure LLM inference traces\n"
        "(Microsoft, https://github.com/Azure/AzurePublicDataset), licensed CC-BY-4.0;\n"
        "rows kept with probability {sample}, timestamps as seconds since the epoch (UTC)."
    ),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--azure", type=Path, help="an Azure LLM inference trace CSV")
    parser.add_argument("--model", default="azure", help="the model name for its requests")
    parser.add_argument("--sample", type=float, default=1.0, help="share of rows to keep")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    if args.azure is not None:
        rows = azure(args.azure, args.model, args.sample, args.seed)
        header = HEADER["azure"].format(source=args.azure.name, sample=args.sample)
    else:
        rows = synthetic(args.seed)
        header = HEADER["synthetic"].format(seed=args.seed)
    for line in header.splitlines():
        print(f"# {line}")
    print("timestamp,model,output_tokens")
    for at, model, tokens in rows:
        print(f"{at:.3f},{model},{tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
