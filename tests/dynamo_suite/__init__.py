"""PyTorch's own test/dynamo files as a development suite for tinydynamo (see ``run.py``)."""
