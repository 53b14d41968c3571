"""SGLang's storage interface as declared at sgl-project/sglang 8905cbd42 (restated: signatures only)."""
