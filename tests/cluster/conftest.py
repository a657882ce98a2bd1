"""Each test process keeps its cluster's endpoint file (URL, token) in a folder of its own: a cluster
writes the host's one endpoint file, so two pytest-xdist workers running clusters at once would
overwrite each other's token (a ``pd ctl`` then got 401)."""
import pytest

from opforge.cluster import endpoint


@pytest.fixture(autouse=True, scope="session")
def _own_endpoint_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster-endpoint")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(endpoint, "directory", lambda: folder)
        yield folder
