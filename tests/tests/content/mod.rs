//! Rich content end to end: every content type per channel goes from CreateTask through the
//! real scheduler and executor to the provider fakes in its documented shape; what a channel
//! cannot send is INVALID_ARGUMENT naming the field; WeCom media links are fetched once and
//! uploaded once however many sends share them; and a link to a private address fails the
//! task PERMANENT without anything being fetched.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use herald_proto::v1::{
    account_service_client::AccountServiceClient, content::Body, interactive::Action, media,
    task_service_client::TaskServiceClient, template_button, template_header, Account,
    AccountLimits, Content, CreateAccountRequest, Interactive, ListAction, ListAttemptsRequest,
    ListRow, ListSection, Location, Media, MediaKind, News, NewsArticle, OutcomeClass, ReplyButton,
    ReplyButtons, TaskSpec, TaskState, TemplateButton, TemplateContent, TemplateHeader, TextCard,
    TextNoticeCard,
};
use herald_tests::fakes::media::{png, FakeMedia};
use herald_tests::fakes::wecom::FakeWeCom;
use herald_tests::fakes::whatsapp::FakeWhatsApp;
use herald_tests::{
    connect_tasks, create_task, task_spec, wait_for_task_state, ExecutorProcess, SchedulerProcess,
    TestDb,
};
use serde_json::Value;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// JSON fields a request must carry: (JSON pointer, value).
type Fields = Vec<(&'static str, Value)>;

mod channel_checks;
mod media_links;
mod stored_templates;
mod wecom;
mod whatsapp;

const WAIT: Duration = Duration::from_secs(30);

fn content(body: Body) -> Content {
    Content {
        body: Some(body),
        link_preview: false,
    }
}

fn media(kind: MediaKind, source: media::Source) -> Media {
    Media {
        kind: kind as i32,
        source: Some(source),
        ..Default::default()
    }
}

fn link(url: &str) -> media::Source {
    media::Source::Link(url.to_owned())
}

async fn create_accounts(url: &str, accounts: &[(&str, &str)]) -> Result<()> {
    let mut client =
        AccountServiceClient::new(Channel::from_shared(url.to_owned())?.connect().await?);
    for (id, kind) in accounts {
        client
            .create_account(CreateAccountRequest {
                account: Some(Account {
                    id: (*id).into(),
                    sender_kind: (*kind).into(),
                    pool: format!("pool-{id}"),
                    limits: Some(AccountLimits {
                        rate_per_second: 100.0,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .await?;
    }
    Ok(())
}

/// Creates a task for `account` sending `content` to `recipient`; returns its id.
async fn send(
    tasks: &mut TaskServiceClient<Channel>,
    account: &str,
    recipient: &str,
    content: Content,
) -> Result<String> {
    let spec = TaskSpec {
        account_id: account.into(),
        content: Some(content),
        max_attempts: Some(1),
        ..task_spec("content", recipient, "unused")
    };
    Ok(create_task(tasks, spec).await?.id)
}

/// The fake's request whose callback data names `task`.
fn request_of(requests: &[Value], task: &str) -> Result<Value> {
    requests
        .iter()
        .find(|b| {
            b["biz_opaque_callback_data"]
                .as_str()
                .is_some_and(|d| d.starts_with(task))
        })
        .cloned()
        .with_context(|| format!("no request for task {task}"))
}

fn wa_executor_config(fake: &FakeWhatsApp) -> String {
    format!(
        "[accounts.wa-1]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1001\"\n\
         access_token = \"token\"\nbase_url = \"{}\"\n",
        fake.base_url()
    )
}

fn wecom_config(wecom: &FakeWeCom, media: Option<&FakeMedia>) -> String {
    let mut config = format!(
        "[accounts.wc-1]\nsender = \"wecom\"\ncorp_id = \"corp\"\ncorp_secret = \"secret\"\n\
         agent_id = 7\nbase_url = \"{0}\"\n\
         [accounts.robot-1]\nsender = \"wecom_robot\"\nwebhook_key = \"robot\"\nbase_url = \"{0}\"\n",
        wecom.base_url()
    );
    if let Some(m) = media {
        config.push_str(&m.media_table());
    }
    config
}
