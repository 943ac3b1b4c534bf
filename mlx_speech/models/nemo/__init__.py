"""The NeMo front end shared by the NeMo families (Nemotron ASR, Sortformer diarization):
`features` (NeMo's log-mel, offline and streaming, bit-exact under any chunking) and
`checkpoint` (the `.nemo` archive read without torch, and the FastConformer key names)."""
