-- A provider template's fixed header and button parameters (an encoded herald.v1.TemplateContent
-- holding only `header` and `buttons`), sent with every use unless the task gives its own.
ALTER TABLE herald.templates ADD COLUMN provider_components bytea;
