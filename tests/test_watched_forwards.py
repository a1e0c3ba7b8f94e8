"""bench.forward_cost.watched_forwards: scripts watch the target's forwards, not its views'."""
import copy

from specdraft.bench.forward_cost import watched_forwards


class Model:
    def __init__(self, name):
        self.name = name

    def forward(self, ids, scale=1):
        return (self.name, [i * scale for i in ids])


def test_only_the_watched_model_s_forwards_are_seen_and_its_views_run_their_own():
    target, own = Model("target"), Model.forward
    seen = []

    def watch(forward, ids, **kw):
        seen.append(len(ids))
        return forward(ids, **kw)

    with watched_forwards(target, watch):
        view = copy.copy(target)  # as LlamaModel.with_layers makes its views
        view.name = "view"
        assert target.forward([1, 2], scale=3) == ("target", [3, 6])
        assert view.forward([1, 2, 3]) == ("view", [1, 2, 3])
    assert seen == [2]
    assert Model.forward is own and "forward" not in vars(target)
    target.forward([4])
    assert seen == [2]  # unwatched after the block
