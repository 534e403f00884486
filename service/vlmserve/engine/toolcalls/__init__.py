"""Tool calls: the format registry, the streaming parsers, harmony output and the call grammars."""
