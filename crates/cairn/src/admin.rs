//! `cairn admin …`: change the master group, drain chunkservers.

use crate::cluster::ClusterArgs;
use cairn_rpc::{Masters, pb};

#[derive(clap::Args)]
pub struct AdminArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(clap::Subcommand)]
pub enum AdminCommand {
    /// Make these masters the voting group (`1=HOST:PORT,2=HOST:PORT,…`); new ones are added
    /// as learners first and caught up. Start a new master with the same --peers list.
    Masters { peers: String },
    /// Stop placing new chunks on a chunkserver.
    Drain { server_id: u64 },
    /// Place new chunks on a drained chunkserver again.
    Undrain { server_id: u64 },
}

pub fn run(a: AdminArgs) -> anyhow::Result<()> {
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let m = Masters::new(&masters)?;
        match a.command {
            AdminCommand::Masters { peers } => {
                let req = pb::MembershipRequest {
                    masters: crate::master::parse_peers(&peers)?
                        .into_iter()
                        .map(|(id, addr)| pb::MasterStatus {
                            id,
                            addr,
                            voter: true,
                        })
                        .collect(),
                };
                let s = m
                    .send(req, |mut c, r| async move { c.change_membership(r).await })
                    .await?;
                for x in s.masters {
                    println!(
                        "master {} {} {}",
                        x.id,
                        x.addr,
                        if x.voter { "voter" } else { "learner" }
                    );
                }
            }
            AdminCommand::Drain { server_id } | AdminCommand::Undrain { server_id } => {
                let state = if matches!(a.command, AdminCommand::Drain { .. }) {
                    "draining"
                } else {
                    "up"
                };
                let req = pb::ServerStateRequest {
                    server_id,
                    state: state.into(),
                };
                m.send(req, |mut c, r| async move { c.set_server_state(r).await })
                    .await?;
                println!("chunkserver {server_id}: {state}");
            }
        }
        anyhow::Ok(())
    })
}
