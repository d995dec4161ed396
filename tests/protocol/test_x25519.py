"""X25519 against RFC 7748's test vectors (protocol/x25519.py)."""

from __future__ import annotations

import pytest

from linkescape.protocol.x25519 import BASE, private_key, public_key, shared, x25519


def test_the_rfcs_single_multiplication_vectors():
    # RFC 7748 section 5.2
    assert x25519(bytes.fromhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4"),
                  bytes.fromhex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c")).hex() == \
        "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"
    assert x25519(bytes.fromhex("4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d"),
                  bytes.fromhex("e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493")).hex() == \
        "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957"


def test_the_rfcs_iterated_vector_after_1000_rounds():
    k = u = BASE
    for i in range(1000):
        k, u = x25519(k, u), k
        if i == 0:
            assert k.hex() == "422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079"
    assert k.hex() == "684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51"


def test_the_rfcs_diffie_hellman_and_a_random_pair():
    # RFC 7748 section 6.1
    a = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    b = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
    assert public_key(a).hex() == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    assert public_key(b).hex() == "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
    k = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
    assert shared(a, public_key(b)).hex() == k and shared(b, public_key(a)).hex() == k
    x, y = private_key(), private_key()
    assert shared(x, public_key(y)) == shared(y, public_key(x)) != shared(x, public_key(private_key()))


def test_a_public_key_of_small_order_is_refused():
    with pytest.raises(ValueError, match="small order"):
        shared(private_key(), bytes(32))
    with pytest.raises(ValueError):
        x25519(b"short", BASE)
