"""Generated tokens -> text, reasoning and tool calls: detokenizer, parsers, stop sequences."""
