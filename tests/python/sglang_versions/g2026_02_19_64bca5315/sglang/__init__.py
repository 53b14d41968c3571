"""SGLang's storage interface as declared at sgl-project/sglang 64bca5315 (restated: signatures only)."""
