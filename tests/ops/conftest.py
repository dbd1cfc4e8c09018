"""Live federations for the operator tools' tests: the e2e suite's fixture."""

from tests.e2e.conftest import make_federation

__all__ = ["make_federation"]
