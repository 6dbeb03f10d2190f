"""Scraping a Ray node's metrics export port the way Prometheus does, parsed with ``prometheus_client``'s parser."""

from __future__ import annotations

import urllib.request

from tests.support.proc import free_port as free_port  # the tests that scrape pick their port with it

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int, host: str = "127.0.0.1", prefix: str = "sc_app_") -> Samples:
    """sample name -> [(labels, value)] of the metric families whose name holds ``prefix``."""
    from prometheus_client import parser

    body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    out: Samples = {}
    for family in parser.text_string_to_metric_families(body):
        if prefix not in family.name:
            continue
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def try_scrape(port: int, host: str = "127.0.0.1") -> Samples:
    """``scrape``, or nothing while the endpoint is not up yet."""
    try:
        return scrape(port, host)
    except OSError:
        return {}


def one(got: Samples, name: str, **labels: str) -> float:
    """The single value of ``name`` whose labels include ``labels``."""
    rows = [v for lab, v in got.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]
    assert len(rows) == 1, f"{name}{labels}: {got.get(name)}"
    return rows[0]
