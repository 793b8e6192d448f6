"""dsv4-operator: serves DeepSeek-V4-class models on SGLang with P/D disaggregation, correctly."""
