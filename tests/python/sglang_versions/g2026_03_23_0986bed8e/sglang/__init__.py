"""SGLang's storage interface as declared at sgl-project/sglang 0986bed8e (restated: signatures only)."""
