"""The models a facade serves: how a request finds its pool (which models there are is
`vlmserve.facade.settings.model_routes`) and what each model is (its catalog)."""
