"""Retrieval datastores (REST: a search engine as the prophet): a token stream of text files
with a suffix array over it (datastore), its bounded-depth sorting (suffix_array), building one
from files (build) and the ``specdraft index`` command (command). The drafter that reads one is
drafters.retrieval."""
