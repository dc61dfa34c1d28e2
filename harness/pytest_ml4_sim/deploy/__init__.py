"""The embedded deployment: every process the project starts, and the one interface the plugin asks for.

Kept free of imports: the Dynamo worker's entry point runs inside the Dynamo venv with the checkout on its path.
"""
