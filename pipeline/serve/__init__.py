"""Ray Serve application: preview sliders live and browse a built benchmark in a browser.

Everything lives in :mod:`pipeline.serve.app`; this package only marks the import path
``pipeline.serve.app:build_app`` used by ``serve run``, ``deploy/serve.yaml`` and
``deploy/kuberay/rayservice.yaml``.  Importing the package does not import Ray.
"""
