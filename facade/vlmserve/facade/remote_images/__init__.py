"""Remote (http/https) image URLs: the checks (pure) and the fetcher."""
