"""SGLang's storage interface as declared at sgl-project/sglang 60d36e7be (restated: signatures only)."""
