-- Forgets a delivered notification.
DELETE FROM herald.notifications WHERE id = $1
