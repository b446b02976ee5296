"""Every body the API reads or writes, in marshmallow: `requests` loads what a client sends,
`responses` dumps what the service answers, and `fields` holds the field types and patterns both use.
The OpenAPI document (service/http/openapi.py) is generated from them."""
