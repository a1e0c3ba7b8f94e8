"""Trained drafting heads on the target's own features (EAGLE-style, without attention).

- ``corpus``: the training text (found on the machine, so nothing is downloaded);
- ``data``: teacher-forced target forwards that record features and the target's choices;
- ``model``: the head itself (one MLP step from (feature, token) to the next feature);
- ``train``: fitting a head to recorded features (tensors in, head out);
- ``command``: ``specdraft train-head``, the command-line entry (loads the target through the
  pipeline: a top-layer module, imported only by the CLI).
"""
