"""The create request for one server of a node group: its name, user data, metadata and
ownership marks, as the workers send it for CA and the warm pools' keeper to refill a pool."""

from __future__ import annotations

from osas.cloud.port import CreateServerRequest
from osas.domain.servers import OwnershipMarks, server_name
from osas.domain.specs import ClusterSpec, NodeGroupSpec
from osas.domain.warm import node_metadata, warm_metadata
from osas.engine.userdata import SecretFiles, build_user_data, token_in_user_data

__all__ = ["create_request"]


def create_request(
    cluster: ClusterSpec,
    spec: NodeGroupSpec,
    request_id: str,
    files: SecretFiles | None = None,
    *,
    bootstrap_token: str | None = None,
    warm_from: str | None = None,
) -> CreateServerRequest:
    """The create for one server, with the token minted for it where its group has one;
    with ``warm_from`` (a fingerprint), a server to wait in the group's warm pool instead,
    which gets no token. Raises UserDataError when its user data cannot be built (files are
    read through ``files``, which re-reads them only when they changed)."""
    marks = OwnershipMarks(cluster.cluster_name)
    name = server_name(cluster.cluster_name, spec.group_id, request_id)
    in_user_data = token_in_user_data(spec)
    user_data = build_user_data(
        spec,
        cluster_name=cluster.cluster_name,
        name=name,
        files=files or SecretFiles(),
        bootstrap_token=bootstrap_token if in_user_data else None,
    )
    # A warm-pool group's nodes read their token, labels and taints from metadata, cold or
    # claimed alike: one template serves both.
    joins = {} if spec.warm_pool is None else node_metadata(spec, bootstrap_token)
    # Ownership marks last: operator metadata can never forge or erase them.
    metadata = {**spec.metadata, **joins, **marks.metadata(spec.group_id, request_id)}
    if warm_from is not None:
        metadata = warm_metadata(marks, spec, request_id, warm_from)
    return CreateServerRequest(
        name=name,
        flavor=spec.flavor,
        image=spec.image,
        networks=spec.networks,
        metadata=metadata,
        tags=marks.tags(request_id),
        user_data=user_data,
        key_name=spec.key_name,
        security_groups=spec.security_groups,
        availability_zone=spec.availability_zone,
        server_group=spec.server_group,
        boot_volume=spec.boot_volume,
    )
