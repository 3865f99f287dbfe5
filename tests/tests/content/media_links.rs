//! Media links: fetched and uploaded once however many sends share them, uploaded again when
//! WeCom forgot the id, and never fetched from a private address, even through a redirect.

use super::*;

#[tokio::test]
async fn sends_of_one_media_url_upload_it_once_concurrent_or_not() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom"), ("robot-1", "wecom_robot")]).await?;
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let host = FakeMedia::start().await?;
    host.put("/shared.png", "image/png", png());
    let image = content(Body::Media(media(
        MediaKind::Image,
        link(&host.url("/shared.png")),
    )));
    let mut tasks = connect_tasks(&url).await?;
    // Created before the executor starts, so they are leased and sent together.
    let mut ids = Vec::new();
    for user in ["u1", "u2", "u3", "u4", "u5"] {
        ids.push(send(&mut tasks, "wc-1", user, image.clone()).await?);
    }
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(wecom_config(&wecom, Some(&host)))
        .spawn()
        .await?;
    for id in &ids {
        wait_for_task_state(&mut tasks, id, TaskState::Succeeded, WAIT).await?;
    }
    ensure!(wecom.uploads().len() == 1, "{:?}", wecom.uploads());
    ensure!(host.hits("/shared.png") == 1);
    // A later send of the same URL uses the cached id.
    let later = send(&mut tasks, "wc-1", "u6", image).await?;
    wait_for_task_state(&mut tasks, &later, TaskState::Succeeded, WAIT).await?;
    ensure!(wecom.uploads().len() == 1 && host.hits("/shared.png") == 1);
    let ids: Vec<Value> = wecom
        .sends()
        .iter()
        .map(|s| s.body["image"]["media_id"].clone())
        .collect();
    ensure!(
        ids.len() == 6 && ids.iter().all(|i| *i == ids[0]),
        "{ids:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_media_id_wecom_no_longer_knows_is_uploaded_again_and_resent_once() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom"), ("robot-1", "wecom_robot")]).await?;
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let host = FakeMedia::start().await?;
    host.put("/expiring.png", "image/png", png());
    let image = content(Body::Media(media(
        MediaKind::Image,
        link(&host.url("/expiring.png")),
    )));
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(wecom_config(&wecom, Some(&host)))
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&url).await?;
    let first = send(&mut tasks, "wc-1", "u1", image.clone()).await?;
    wait_for_task_state(&mut tasks, &first, TaskState::Succeeded, WAIT).await?;
    ensure!(wecom.uploads().len() == 1, "{:?}", wecom.uploads());

    // WeCom drops the id before the executor's cache would: the next send of the same link
    // names it, is refused 40007, and goes again with a fresh upload, in its one attempt.
    wecom.expire_media();
    let second = send(&mut tasks, "wc-1", "u2", image.clone()).await?;
    wait_for_task_state(&mut tasks, &second, TaskState::Succeeded, WAIT).await?;
    let to_u2: Vec<(i64, bool, Value)> = wecom
        .sends()
        .iter()
        .filter(|s| s.body["touser"] == "u2")
        .map(|s| (s.errcode, s.delivered, s.body["image"]["media_id"].clone()))
        .collect();
    ensure!(to_u2.len() == 2, "{to_u2:?}");
    ensure!(to_u2[0].0 == 40007 && !to_u2[0].1, "{to_u2:?}");
    ensure!(to_u2[1].0 == 0 && to_u2[1].1, "{to_u2:?}");
    ensure!(
        to_u2[0].2 != to_u2[1].2,
        "resent with the refused id: {to_u2:?}"
    );
    ensure!(wecom.uploads().len() == 2 && host.hits("/expiring.png") == 2);
    let attempts = tasks
        .list_attempts(ListAttemptsRequest {
            task_id: second.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    ensure!(
        attempts.len() == 1 && attempts[0].outcome() == OutcomeClass::Ok,
        "{attempts:?}"
    );

    // Refused again after the re-upload: PERMANENT, as any 40007, with no third upload.
    wecom.expire_media();
    wecom.respond_next_send(herald_tests::fakes::wecom::Scripted::Errcode(40007));
    let third = send(&mut tasks, "wc-1", "u3", image).await?;
    let failed = wait_for_task_state(&mut tasks, &third, TaskState::Failed, WAIT).await?;
    ensure!(failed.end_code == 40007, "{failed:?}");
    ensure!(
        wecom
            .sends()
            .iter()
            .filter(|s| s.body["touser"] == "u3")
            .count()
            == 2
    );
    ensure!(wecom.uploads().len() == 3, "{:?}", wecom.uploads());
    Ok(())
}

#[tokio::test]
async fn a_media_link_to_a_private_address_fails_permanent_and_fetches_nothing() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom"), ("robot-1", "wecom_robot")]).await?;
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let host = FakeMedia::start().await?;
    host.put("/a.png", "image/png", png());
    // Trusts the host's CA (so TLS is not why it fails) but allows no private network.
    let config = format!(
        "{}[media]\nca_file = \"{}\"\n",
        wecom_config(&wecom, None),
        host.ca_file().display()
    );
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(config)
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&url).await?;
    for (account, link_url) in [
        ("wc-1", host.url("/a.png")),
        ("wc-1", host.url_by_name("/a.png")),
        ("robot-1", host.url_by_name("/a.png")),
        (
            "robot-1",
            "https://169.254.169.254/latest/meta-data".to_owned(),
        ),
    ] {
        let id = send(
            &mut tasks,
            account,
            "ann",
            content(Body::Media(media(MediaKind::Image, link(&link_url)))),
        )
        .await?;
        wait_for_task_state(&mut tasks, &id, TaskState::Failed, WAIT)
            .await
            .context(link_url.clone())?;
        let attempts = tasks
            .list_attempts(ListAttemptsRequest {
                task_id: id.clone(),
            })
            .await?
            .into_inner()
            .attempts;
        let last = attempts.last().context("attempt")?;
        ensure!(
            last.outcome() == OutcomeClass::Permanent,
            "{link_url}: {last:?}"
        );
        ensure!(
            last.error.contains("refused to fetch") && last.error.contains("public"),
            "{link_url}: {}",
            last.error
        );
    }
    ensure!(host.total_hits() == 0, "the guard let a request through");
    ensure!(
        wecom.uploads().is_empty() && wecom.sends().is_empty() && wecom.robot_requests().is_empty()
    );
    Ok(())
}

#[tokio::test]
async fn a_redirect_to_a_refused_address_is_not_followed() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom"), ("robot-1", "wecom_robot")]).await?;
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let host = FakeMedia::start().await?;
    host.put("/a.png", "image/png", png());
    // The first hop is allowed (127.0.0.1); the redirect's target (::1) is not.
    host.redirect("/hop.png", &format!("https://[::1]:{}/a.png", host.port()));
    let config = format!(
        "{}[media]\nallowed_networks = [\"127.0.0.1/32\"]\nca_file = \"{}\"\n",
        wecom_config(&wecom, None),
        host.ca_file().display()
    );
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(config)
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&url).await?;
    let id = send(
        &mut tasks,
        "wc-1",
        "ann",
        content(Body::Media(media(
            MediaKind::Image,
            link(&host.url("/hop.png")),
        ))),
    )
    .await?;
    wait_for_task_state(&mut tasks, &id, TaskState::Failed, WAIT).await?;
    let attempts = tasks
        .list_attempts(ListAttemptsRequest { task_id: id })
        .await?
        .into_inner()
        .attempts;
    let last = attempts.last().context("attempt")?;
    ensure!(last.outcome() == OutcomeClass::Permanent, "{last:?}");
    ensure!(last.error.contains("redirect to"), "{}", last.error);
    ensure!(host.hits("/hop.png") == 1 && host.hits("/a.png") == 0);
    ensure!(wecom.uploads().is_empty());
    Ok(())
}
