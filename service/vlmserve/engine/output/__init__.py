"""Generated tokens -> text, reasoning and tool calls: detokenizer, stop sequences, the assembler."""
