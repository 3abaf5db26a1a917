"""Adapters that plug flashtile into other libraries.

Each submodule imports its library on import, so importing ``flashtile`` (or this
package) never does: ``import flashtile.integrations.transformers`` is what pulls in
Hugging Face transformers and registers the ``"flashtile"`` attention implementation.
"""
