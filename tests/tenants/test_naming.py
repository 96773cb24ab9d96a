from clawhub.tenants import naming


def test_model_ids_and_upstream_names():
    assert naming.tenant_model_id(group_slug=None) == "clawhub-personal"
    assert naming.tenant_model_id(group_slug="ml") == naming.group_model_id("ml") == "clawhub-group-ml"
    assert naming.upstream_adapter_name(tenant_id=7, version=3) == "t7-v3"
    assert naming.models_offered(tenant_model_id="clawhub-personal") == ["clawhub-personal", "base"]


def test_models_for_key_narrows_to_the_allowed_ones():
    group = "clawhub-group-a"
    assert naming.models_for_key(tenant_model_id=group, allowed_models=[]) == [group, "base"]
    assert naming.models_for_key(tenant_model_id=group, allowed_models=None) == [group, "base"]
    assert naming.models_for_key(tenant_model_id=group, allowed_models=["base"]) == ["base"]


def test_model_access_tells_not_allowed_from_not_found():
    def access(model, allowed=()):
        return naming.model_access(model=model, tenant_model_id="clawhub-group-a", allowed_models=allowed)

    assert access("clawhub-group-a") == access("base") == "ok"
    assert access("clawhub-group-b") == access("clawhub-personal") == "not_allowed"  # another tenant's
    assert access("base", allowed=["clawhub-group-a"]) == "not_allowed"
    assert access("clawhub-group-a", allowed=["base"]) == "not_allowed"
    assert access("gpt-4o") == "not_found"


def test_metric_labels_fold_group_ids():
    models = ("clawhub-group-x", "clawhub-personal", "base", "gpt-4o", None)
    labels = ["clawhub-group", "clawhub-personal", "base", "other", "none"]
    assert [naming.metric_label(m) for m in models] == labels


def test_a_version_of_an_adapter_has_an_id_of_its_own_that_only_playground_keys_may_name():
    assert naming.version_model_id("clawhub-group-a", 3) == "clawhub-group-a:v3"
    assert naming.split_version("clawhub-group-a:v3") == ("clawhub-group-a", 3)
    for unversioned in ("clawhub-group-a", "clawhub-personal:v0", "clawhub-personal:v03", "base:vx"):
        assert naming.split_version(unversioned) == (unversioned, None)

    def access(model, versions):
        return naming.model_access(model=model, tenant_model_id="clawhub-group-a", allowed_models=(),
                                   versions=versions)

    assert access("clawhub-group-a:v2", versions=True) == "ok"
    assert access("clawhub-group-a:v2", versions=False) == "not_allowed"
    assert access("clawhub-group-b:v2", versions=True) == "not_allowed"  # another tenant's
    assert access("base:v2", versions=True) == access("gpt-4o:v1", versions=True) == "not_found"
    assert naming.metric_label("clawhub-group-a:v2") == "clawhub-group"
    assert naming.metric_label("clawhub-personal:v2") == "clawhub-personal"
