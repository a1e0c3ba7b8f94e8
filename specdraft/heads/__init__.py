"""Trained drafters on the target's own features: the MLP head, EAGLE's decoder layer, Medusa / Hydra heads.

- ``corpus``: the training text (found on the machine, so nothing is downloaded);
- ``data``: teacher-forced target forwards that record features and the target's choices;
- ``model``: the MLP head (one step from (feature, token) to the next feature), and the files
  every trained drafter is saved in and loaded from;
- ``train``: fitting the MLP head to recorded features (tensors in, head out);
- ``eagle``: EAGLE's drafter, one decoder layer attending over the context's features (the EAGLE-1
  layer, or attention in front of the MLP head's step);
- ``eagle_train``: fitting it with training-time test (it learns from its own predictions);
- ``device``: where training runs (the CPU, or a CUDA GPU when there is one);
- ``medusa``: Medusa and Hydra heads (K heads on the newest feature) and their training;
- ``export``: a layer-form EAGLE drafter in vLLM's speculators layout, Medusa heads in its Medusa layout;
- ``command``: ``specdraft train-drafter`` / ``train-head`` / ``export``, the command-line
  entries (they load the target through the pipeline: top-layer modules, imported only by the CLI).
"""
