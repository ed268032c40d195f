"""The lab's kernels inside other libraries' models (transformers: `lab.integrations.transformers.register()`)."""
