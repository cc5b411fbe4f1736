//! `etcdserverpb.Cluster` and `etcdserverpb.Maintenance`: the parts clients call at connect time
//! or for `etcdctl endpoint status/health` and `member list`. Everything that changes or reads
//! the whole cluster (membership, defragment, hashes, snapshots, leadership, downgrades, alarms
//! other than listing them) is refused: a tenant of a namespace may not act on the cluster.
//!
//! MemberList answers with one member, the proxy at the address the client reached it by, so a
//! client that syncs its endpoints from the member list (Go's `AutoSyncInterval`) stays on the
//! proxy instead of going around it to etcd.

use etcd_client::proto::{
    PbAlarmRequest, PbAlarmResponse, PbClusterService, PbDefragmentRequest, PbHashKvRequest,
    PbHashKvResponse, PbHashRequest, PbHashResponse, PbMaintenanceService, PbMember,
    PbMemberAddRequest, PbMemberAddResponse, PbMemberListRequest, PbMemberListResponse,
    PbMemberPromoteRequest, PbMemberPromoteResponse, PbMemberRemoveRequest, PbMemberRemoveResponse,
    PbMemberUpdateRequest, PbMemberUpdateResponse, PbMoveLeaderRequest, PbMoveLeaderResponse,
    PbSnapshotRequest, PbSnapshotResponse, PbStatusRequest, PbStatusResponse,
};
use etcd_client::{AlarmAction, AlarmType};
use futures::stream::BoxStream;
use tonic::{Request, Response};

use super::{called_url, status, Front, Judged};
use crate::etcdapi::Status;

type Answer<T> = Result<Response<T>, tonic::Status>;

/// The refusal of every call that acts on the whole cluster.
fn cluster_wide<T>() -> Answer<T> {
    Err(status(Status::cluster_wide()))
}

/// The proxy's own member: named `lease-proxy`, with the URL the client called.
fn member(id: u64, req: &Request<PbMemberListRequest>) -> PbMember {
    let url = req
        .extensions()
        .get::<Judged>()
        .and_then(|j| called_url(&j.uri));
    PbMember {
        id,
        name: "lease-proxy".into(),
        client_ur_ls: url.into_iter().collect(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl PbClusterService for Front {
    async fn member_add(&self, _: Request<PbMemberAddRequest>) -> Answer<PbMemberAddResponse> {
        cluster_wide()
    }

    async fn member_remove(
        &self,
        _: Request<PbMemberRemoveRequest>,
    ) -> Answer<PbMemberRemoveResponse> {
        cluster_wide()
    }

    async fn member_update(
        &self,
        _: Request<PbMemberUpdateRequest>,
    ) -> Answer<PbMemberUpdateResponse> {
        cluster_wide()
    }

    async fn member_list(&self, req: Request<PbMemberListRequest>) -> Answer<PbMemberListResponse> {
        self.caller(&req)?;
        let header = self.etcd.header().await.map_err(Status::from);
        let header = header.map_err(status)?;
        Ok(Response::new(PbMemberListResponse {
            members: vec![member(header.member_id, &req)],
            header: Some(header.into()),
        }))
    }

    async fn member_promote(
        &self,
        _: Request<PbMemberPromoteRequest>,
    ) -> Answer<PbMemberPromoteResponse> {
        cluster_wide()
    }
}

#[tonic::async_trait]
impl PbMaintenanceService for Front {
    /// Listing alarms (`etcdctl endpoint health` does) is etcd's answer; changing them is
    /// refused.
    async fn alarm(&self, req: Request<PbAlarmRequest>) -> Answer<PbAlarmResponse> {
        self.caller(&req)?;
        if req.get_ref().action != AlarmAction::Get as i32 {
            return cluster_wide();
        }
        let answer = self
            .etcd
            .bounded("grpc_alarm_list", |c| async move {
                c.maintenance_client()
                    .alarm(AlarmAction::Get, AlarmType::None, None)
                    .await
            })
            .await;
        Ok(Response::new(answer.map_err(|e| status(e.into()))?.0))
    }

    /// The status of the etcd member the proxy reaches (`etcdctl endpoint status`).
    async fn status(&self, req: Request<PbStatusRequest>) -> Answer<PbStatusResponse> {
        self.caller(&req)?;
        let answer = self
            .etcd
            .bounded("grpc_status", |c| async move {
                c.maintenance_client().status().await
            })
            .await;
        Ok(Response::new(answer.map_err(|e| status(e.into()))?.0))
    }

    async fn defragment(
        &self,
        _: Request<PbDefragmentRequest>,
    ) -> Answer<etcd_client::proto::PbDefragmentResponse> {
        cluster_wide()
    }

    async fn hash(&self, _: Request<PbHashRequest>) -> Answer<PbHashResponse> {
        cluster_wide()
    }

    async fn hash_kv(&self, _: Request<PbHashKvRequest>) -> Answer<PbHashKvResponse> {
        cluster_wide()
    }

    type SnapshotStream = BoxStream<'static, Result<PbSnapshotResponse, tonic::Status>>;

    async fn snapshot(&self, _: Request<PbSnapshotRequest>) -> Answer<Self::SnapshotStream> {
        cluster_wide()
    }

    async fn move_leader(&self, _: Request<PbMoveLeaderRequest>) -> Answer<PbMoveLeaderResponse> {
        cluster_wide()
    }

    async fn downgrade(
        &self,
        _: Request<etcd_client::proto::PbDowngradeRequest>,
    ) -> Answer<etcd_client::proto::PbDowngradeResponse> {
        cluster_wide()
    }
}
