"""pytest's doctest of the pages' ``>>>`` sessions (scripts/test.sh: ``--doctest-glob='*.md' docs``):
each page is a single-process session that may call init_process_group; it ends with the page."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def fresh_session_per_page():
    yield
    import pydist as dist
    if dist.is_initialized():
        dist.destroy_process_group()
