"""``gantool serve``: the FastAPI app (``app.build_app``), the model worker that batches
requests (``app.Batcher``), the request limits (``app.ServeSettings``) and the server process
(``app.run_server``), with the browser page in ``static/``.
"""
