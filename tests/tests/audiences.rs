//! AudienceService on the real binary: a CSV with good and bad rows (bad ones reported by line,
//! good ones kept, a second import upserting by recipient), a 50,000-row import with correct
//! counts, single-contact edits, searches with page tokens, and validation naming the field.

use std::fmt::Write as _;

use anyhow::{ensure, Context, Result};
use herald_proto::v1::{
    audience_service_client::AudienceServiceClient, AddContactRequest, Audience, AudienceChannel,
    Contact, CreateAudienceRequest, GetAudienceRequest, ImportContactsCsvRequest,
    ImportContactsRequest, ImportProgress, ListContactsRequest, RemoveContactRequest,
    UpdateContactRequest,
};
use herald_tests::{SchedulerProcess, TestDb};
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

async fn client(s: &SchedulerProcess) -> Result<AudienceServiceClient<Channel>> {
    Ok(AudienceServiceClient::connect(s.grpc_url()).await?)
}

async fn create(
    c: &mut AudienceServiceClient<Channel>,
    id: &str,
    channel: AudienceChannel,
) -> Result<Audience> {
    Ok(c.create_audience(CreateAudienceRequest {
        audience: Some(Audience {
            id: id.into(),
            channel: channel as i32,
            default_time_zone: "Europe/Berlin".into(),
            date_attributes: vec!["birthday".into()],
            ..Default::default()
        }),
    })
    .await?
    .into_inner())
}

/// Sends `csv` in chunks of `chunk` bytes and collects every progress message.
async fn import_csv(
    c: &mut AudienceServiceClient<Channel>,
    audience: &str,
    csv: &str,
    chunk: usize,
) -> Result<Vec<ImportProgress>> {
    let chunks: Vec<ImportContactsCsvRequest> = csv
        .as_bytes()
        .chunks(chunk)
        .enumerate()
        .map(|(i, data)| ImportContactsCsvRequest {
            audience_id: if i == 0 {
                audience.into()
            } else {
                String::new()
            },
            data: data.to_vec(),
        })
        .collect();
    let mut progress = c
        .import_contacts_csv(tokio_stream::iter(chunks))
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(p) = progress.message().await? {
        out.push(p);
    }
    Ok(out)
}

fn field_of(status: &tonic::Status) -> Vec<String> {
    status
        .get_error_details()
        .bad_request()
        .map(|b| b.field_violations.iter().map(|f| f.field.clone()).collect())
        .unwrap_or_default()
}

/// An upload that breaks off keeps none of the row it was cut in: the parser used to take the
/// end of what came as the end of the file, so a number cut short (a stranger's, here
/// `+49151123`) became a contact, or a contact lost the fields after the cut. Here the second
/// chunk names another audience, which ends the upload with that error.
#[tokio::test]
async fn an_upload_broken_off_keeps_nothing_of_the_row_it_was_cut_in() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    create(&mut c, "staff", AudienceChannel::Whatsapp).await?;
    let chunks = vec![
        ImportContactsCsvRequest {
            audience_id: "staff".into(),
            data: b"recipient,name\n+4915112345678,Ann\n+49151123".to_vec(),
        },
        ImportContactsCsvRequest {
            audience_id: "other".into(),
            data: b"45,Bo\n".to_vec(),
        },
    ];
    let mut progress = c
        .import_contacts_csv(tokio_stream::iter(chunks))
        .await?
        .into_inner();
    let ended = loop {
        match progress.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => anyhow::bail!("the import ended without an error"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), Code::InvalidArgument, "{ended:?}");
    assert_eq!(field_of(&ended), ["audience_id"], "{ended:?}");
    let kept = c
        .list_contacts(ListContactsRequest {
            audience_id: "staff".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .contacts;
    let recipients: Vec<&str> = kept.iter().map(|c| c.recipient.as_str()).collect();
    assert!(
        !recipients.contains(&"+49151123"),
        "the row cut short became a contact: {recipients:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_csv_with_bad_rows_keeps_the_good_ones_and_reports_each_bad_line() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    create(&mut c, "customers", AudienceChannel::Whatsapp).await?;
    // Line 1 is the header. Lines 3, 5, 6 and 7 are bad for different reasons; line 8 repeats
    // line 2's recipient, so it wins (upsert by recipient).
    let csv = "recipient,name,time_zone,tags,birthday,city\n\
               +4915112345601,Ann,Europe/Berlin,vip;de,1990-03-07,Berlin\n\
               4915112345602,No plus,,,,\n\
               +4915112345603,\"Bo, Jr\",Asia/Shanghai,,12-24,\n\
               +4915112345604,Bad zone,Mars/Olympus,,,\n\
               +4915112345605,Bad date,,,1990-02-30,\n\
               +4915112345606,Too,many,fields,here,x,y\n\
               +4915112345601,Ann B,Europe/Berlin,vip,1990-03-07,Hamburg\n";
    // Tiny chunks: rows and quoted fields span chunk boundaries.
    let progress = import_csv(&mut c, "customers", csv, 7).await?;
    let last = progress.last().context("no progress")?;
    ensure!(
        last.done,
        "the last message is not marked done: {progress:?}"
    );
    assert_eq!(
        (last.received, last.created, last.updated, last.rejected),
        (7, 2, 0, 4)
    );
    assert_eq!(last.contact_count, 2);
    let mut errors: Vec<(i64, String)> = progress
        .iter()
        .flat_map(|p| p.errors.iter().map(|e| (e.line, e.field.clone())))
        .collect();
    errors.sort();
    assert_eq!(
        errors,
        vec![
            (3, "recipient".to_string()),
            (5, "time_zone".to_string()),
            (6, "attributes.birthday".to_string()),
            (7, String::new()),
        ]
    );
    let ann = c
        .list_contacts(ListContactsRequest {
            audience_id: "customers".into(),
            recipient_prefix: "+4915112345601".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .contacts;
    assert_eq!(ann.len(), 1);
    assert_eq!(ann[0].name, "Ann B");
    assert_eq!(
        ann[0].attributes.get("city").map(String::as_str),
        Some("Hamburg")
    );
    assert_eq!(ann[0].tags, vec!["vip"]);

    // Importing again updates instead of creating.
    let again = import_csv(&mut c, "customers", csv, 4096).await?;
    let last = again.last().context("no progress")?;
    assert_eq!((last.created, last.updated, last.contact_count), (0, 2, 2));

    // A header without a recipient column is refused whole, naming the data.
    let bad = import_csv(&mut c, "customers", "phone,name\n+4915112345601,x\n", 4096)
        .await
        .err()
        .context("a header without recipient was accepted")?;
    let status = bad
        .downcast_ref::<tonic::Status>()
        .context("not a status")?;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(field_of(status), vec!["data"]);
    Ok(())
}

#[tokio::test]
async fn fifty_thousand_rows_import_with_correct_counts() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    create(&mut c, "staff", AudienceChannel::Wecom).await?;
    let mut csv = String::from("recipient,name,tags,birthday\n");
    for i in 0..50_000 {
        if i % 1_000 == 999 {
            // A bad recipient every thousand rows.
            writeln!(csv, "user {i},Bad {i},,")?;
        } else {
            let tag = if i % 2 == 0 { "even" } else { "odd" };
            writeln!(
                csv,
                "user{i:05},Person {i},{tag},{:02}-{:02}",
                i % 12 + 1,
                i % 28 + 1
            )?;
        }
    }
    let progress = import_csv(&mut c, "staff", &csv, 64 * 1024).await?;
    let last = progress.last().context("no progress")?;
    ensure!(last.done);
    assert_eq!(
        (last.received, last.created, last.updated, last.rejected),
        (50_000, 49_950, 0, 50)
    );
    // Progress came batch by batch, its totals growing.
    ensure!(
        progress.len() >= 50,
        "only {} progress messages",
        progress.len()
    );
    ensure!(progress.windows(2).all(|w| w[0].received <= w[1].received));
    let audience = c
        .get_audience(GetAudienceRequest { id: "staff".into() })
        .await?
        .into_inner();
    assert_eq!(audience.contact_count, 49_950);
    let stored: i64 = db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) FROM herald.contacts WHERE audience_id = 'staff'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(stored, 49_950);

    // Walk the "even" tag in pages: every even contact once, in order.
    let mut token = String::new();
    let mut seen = 0;
    let mut last_recipient = String::new();
    loop {
        let page = c
            .list_contacts(ListContactsRequest {
                audience_id: "staff".into(),
                tags: vec!["even".into()],
                page_size: 1_000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        for contact in &page.contacts {
            ensure!(contact.tags == vec!["even".to_string()]);
            ensure!(contact.recipient > last_recipient, "pages out of order");
            last_recipient = contact.recipient.clone();
        }
        seen += page.contacts.len();
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, 25_000);
    Ok(())
}

#[tokio::test]
async fn single_contacts_stream_imports_and_validation_naming_the_field() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    create(&mut c, "team", AudienceChannel::Wecom).await?;

    // A bad channel is refused naming it, and creates nothing.
    let bad = c
        .create_audience(CreateAudienceRequest {
            audience: Some(Audience {
                id: "nochannel".into(),
                ..Default::default()
            }),
        })
        .await
        .err()
        .context("an audience without a channel was accepted")?;
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(field_of(&bad), vec!["audience.channel"]);

    let zhang = Contact {
        recipient: "zhangsan".into(),
        name: "Zhang San".into(),
        time_zone: "Asia/Shanghai".into(),
        locale: "zh_CN".into(),
        tags: vec!["sales".into()],
        attributes: [("birthday".to_string(), "1988-05-04".to_string())].into(),
        ..Default::default()
    };
    c.add_contact(AddContactRequest {
        audience_id: "team".into(),
        contact: Some(zhang.clone()),
    })
    .await?;
    let again = c
        .add_contact(AddContactRequest {
            audience_id: "team".into(),
            contact: Some(zhang.clone()),
        })
        .await
        .err()
        .map(|s| s.code());
    assert_eq!(again, Some(Code::AlreadyExists));

    let bad = c
        .update_contact(UpdateContactRequest {
            audience_id: "team".into(),
            contact: Some(Contact {
                attributes: [("birthday".to_string(), "May 4th".to_string())].into(),
                ..zhang.clone()
            }),
        })
        .await
        .err()
        .context("a bad birthday was accepted")?;
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(field_of(&bad), vec!["contact.attributes.birthday"]);
    let bad = c
        .add_contact(AddContactRequest {
            audience_id: "team".into(),
            contact: Some(Contact {
                recipient: "li si".into(),
                ..Default::default()
            }),
        })
        .await
        .err()
        .context("a bad WeCom id was accepted")?;
    assert_eq!(field_of(&bad), vec!["contact.recipient"]);

    let updated = c
        .update_contact(UpdateContactRequest {
            audience_id: "team".into(),
            contact: Some(Contact {
                name: "Zhang San (Sales)".into(),
                ..zhang.clone()
            }),
        })
        .await?
        .into_inner();
    assert_eq!(updated.name, "Zhang San (Sales)");

    // A client stream of batches: good contacts kept, the bad one reported by position.
    let batches = vec![
        ImportContactsRequest {
            audience_id: "team".into(),
            contacts: vec![
                Contact {
                    recipient: "lisi".into(),
                    name: "Li Si".into(),
                    ..Default::default()
                },
                Contact {
                    recipient: "wang wu".into(),
                    ..Default::default()
                },
            ],
        },
        ImportContactsRequest {
            audience_id: String::new(),
            contacts: vec![Contact {
                recipient: "zhaoliu".into(),
                name: "Zhao Liu".into(),
                ..Default::default()
            }],
        },
    ];
    let mut progress = c
        .import_contacts(tokio_stream::iter(batches))
        .await?
        .into_inner();
    let mut all = Vec::new();
    while let Some(p) = progress.message().await? {
        all.push(p);
    }
    let last = all.last().context("no progress")?;
    assert_eq!(
        (last.done, last.created, last.rejected, last.contact_count),
        (true, 2, 1, 3)
    );
    let reported: Vec<(i64, String)> = all
        .iter()
        .flat_map(|p| p.errors.iter().map(|e| (e.line, e.field.clone())))
        .collect();
    assert_eq!(reported, vec![(1, "recipient".to_string())]);

    // Search by name, then remove.
    let found = c
        .list_contacts(ListContactsRequest {
            audience_id: "team".into(),
            name_contains: "LIU".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .contacts;
    assert_eq!(
        found
            .iter()
            .map(|c| c.recipient.as_str())
            .collect::<Vec<_>>(),
        vec!["zhaoliu"]
    );
    c.remove_contact(RemoveContactRequest {
        audience_id: "team".into(),
        recipient: "zhaoliu".into(),
    })
    .await?;
    let gone = c
        .remove_contact(RemoveContactRequest {
            audience_id: "team".into(),
            recipient: "zhaoliu".into(),
        })
        .await
        .err()
        .map(|s| s.code());
    assert_eq!(gone, Some(Code::NotFound));
    // An import naming an id no audience can have is a bad request, not a missing audience.
    let bad = async {
        let mut stream = c
            .import_contacts(tokio_stream::iter(vec![ImportContactsRequest {
                audience_id: "Bad Id".into(),
                contacts: vec![],
            }]))
            .await?
            .into_inner();
        while stream.message().await?.is_some() {}
        Ok::<_, tonic::Status>(())
    }
    .await
    .err()
    .context("an import into \"Bad Id\" was taken")?;
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().contains("audience_id"), "{bad:?}");
    let audience = c
        .get_audience(GetAudienceRequest { id: "team".into() })
        .await?
        .into_inner();
    assert_eq!(audience.contact_count, 2);
    Ok(())
}
