"""Which headers pass between the client's connection and the engine's, either way, and the
X-Forwarded-For, Forwarded and X-Real-IP the engine is sent."""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict

# RFC 9110 hop-by-hop headers belong to one connection, never forwarded; Host and
# Content-Length are recomputed for the new connection and body.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def forward_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    named = {v.strip().lower() for v in headers.get("Connection", "").split(",") if v.strip()}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered not in HOP_BY_HOP and lowered not in named:
            out.add(name, value)
    return out


def forwarded_for(headers: CIMultiDict[str], peer: str | None) -> None:
    """One X-Forwarded-For, and one Forwarded: what the client (or a proxy before the
    gateway) sent, then the peer the gateway saw. Appended, not replaced, so that a chain set
    by an ingress in front survives; a reader trusts entries from the right, as far as it
    trusts the proxies. X-Real-IP is the peer alone."""
    claimed = [v.strip() for v in headers.popall("X-Forwarded-For", []) if v.strip()]
    chain = [*claimed, peer] if peer else claimed
    if chain:
        headers["X-Forwarded-For"] = ", ".join(chain)
    # The same for RFC 7239's Forwarded: the peer is its last element. X-Real-IP names one
    # address, so a client's own is dropped and the peer's put in its place.
    elements = [v.strip() for v in headers.popall("Forwarded", []) if v.strip()]
    if peer:
        node = f'"[{peer}]"' if ":" in peer else peer  # an IPv6 node is quoted and bracketed
        elements.append(f"for={node}")
    if elements:
        headers["Forwarded"] = ", ".join(elements)
    headers.popall("X-Real-IP", None)
    if peer:
        headers["X-Real-IP"] = peer
