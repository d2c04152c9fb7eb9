"""Model code: diffusion loading, sliders, sampling, detectors and classifiers."""
