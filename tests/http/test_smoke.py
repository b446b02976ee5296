def test_take_roundtrip(client, keys):
    assert client.put("/v1/accounts/a1", json={"kind": "user"}, headers=keys["product"]).status_code == 201
    r = client.post("/v1/accounts/a1/takes", json={"metric": "urls"}, headers=keys["product"])
    assert r.status_code == 201, r.json
    assert r.json["used"] == 1
