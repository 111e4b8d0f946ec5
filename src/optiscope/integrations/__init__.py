"""optiscope.integrations: the monitor on training loops that other libraries run.

``optiscope.integrations.transformers.OptiscopeCallback`` (🤗 ``Trainer``, ``pip install 'optiscope[hf]'``)
and ``optiscope.integrations.lightning.OptiscopeCallback`` (Lightning, ``pip install
'optiscope[lightning]'``) attach a ``Monitor`` to the model and optimizer that the library trains. Each
module imports its library, so import the one you use; nothing else in optiscope imports them.
"""
